package store

import (
	"strings"
	"testing"
	"testing/fstest"
)

// Both backends have the same migrations: the same numbers and names.
func TestMigrationsMatchAcrossBackends(t *testing.T) {
	lite, err := loadMigrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	pg, err := loadMigrations("postgres")
	if err != nil {
		t.Fatal(err)
	}
	if len(lite) != len(pg) {
		t.Fatalf("sqlite has %d migrations, postgres %d", len(lite), len(pg))
	}
	for i := range lite {
		if lite[i].version != pg[i].version || lite[i].name != pg[i].name {
			t.Fatalf("migration %d: sqlite %04d_%s, postgres %04d_%s", i, lite[i].version, lite[i].name, pg[i].version, pg[i].name)
		}
	}
}

func TestReadMigrationsRefusesBadSets(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  string
	}{
		{"none", fstest.MapFS{"migrations/x/README": file("")}, "no x migrations"},
		{"gap", fstest.MapFS{"migrations/x/0001_a.sql": file(""), "migrations/x/0003_c.sql": file("")}, "without gaps"},
		{"repeat", fstest.MapFS{"migrations/x/0001_a.sql": file(""), "migrations/x/1_b.sql": file("")}, "without gaps"},
		{"not starting at 1", fstest.MapFS{"migrations/x/0002_a.sql": file("")}, "without gaps"},
		{"no number", fstest.MapFS{"migrations/x/init.sql": file("")}, "positive number"},
		{"zero", fstest.MapFS{"migrations/x/0000_a.sql": file("")}, "positive number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readMigrations(tc.files, "x")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("readMigrations error = %v, want one saying %q", err, tc.want)
			}
		})
	}
	ms, err := readMigrations(fstest.MapFS{
		"migrations/x/0002_b.sql": file("B"), "migrations/x/0001_a.sql": file("A"), "migrations/x/notes.txt": file(""),
	}, "x")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0] != (migration{1, "0001_a", "A"}) || ms[1] != (migration{2, "0002_b", "B"}) {
		t.Fatalf("readMigrations = %+v, want 0001_a then 0002_b", ms)
	}
}
