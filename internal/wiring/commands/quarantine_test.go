package commands_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
)

// quarantineIn quarantines id in the data dir's database as compass-callout
// does (its writer, past a threshold of 1) and returns when.
func quarantineIn(t *testing.T, dir, id string) time.Time {
	t.Helper()
	w, err := store.OpenQuarantineWriter(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	var q store.Quarantine
	for range 2 {
		if q, _, err = w.RecordDisplacement(t.Context(), store.Displacement{RunnerID: id, Newer: "10.0.0.2:40000", Older: "10.0.0.1:50000"},
			store.QuarantinePolicy{After: 1, Window: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	return q.QuarantinedAt
}

// runners lists a quarantined Runner ID with both clients, in text and
// JSON; clear-quarantine ends it and says so; a Runner ID that is not
// quarantined, or none given, is refused by name.
func TestClearQuarantine(t *testing.T) {
	dir := migrated(t)
	mintRunnerToken(t, dir, "build-01")
	at := quarantineIn(t, dir, "build-01").Format(time.RFC3339)

	code, stdout, stderr := runServer(t, nil, "runners", "--data-dir", dir)
	if code != 0 || !strings.Contains(stdout, "QUARANTINED") {
		t.Fatalf("runners: code %d, stdout %q, stderr %q; want the quarantined section", code, stdout, stderr)
	}
	_, section, _ := strings.Cut(stdout, "QUARANTINED")
	if f := strings.Fields(strings.SplitN(section, "\n", 3)[1]); len(f) != 5 || f[0] != "build-01" || f[1] != at || f[2] != "2" ||
		f[3] != "10.0.0.2:40000" || f[4] != "10.0.0.1:50000" {
		t.Fatalf("runners' quarantined row = %q; want build-01, %s, 2 displacements and both clients", f, at)
	}
	code, stdout, _ = runServer(t, nil, "runners", "--data-dir", dir, "--output", "json")
	var got struct {
		Quarantined []map[string]any `json:"quarantined"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); code != 0 || err != nil || len(got.Quarantined) != 1 {
		t.Fatalf("runners --output json: code %d, %v: %s", code, err, stdout)
	}
	if q := got.Quarantined[0]; q["runner_id"] != "build-01" || q["quarantined_at"] != at || q["displacements"] != float64(2) ||
		q["newer_client"] != "10.0.0.2:40000" || q["older_client"] != "10.0.0.1:50000" {
		t.Fatalf("runners --output json quarantined = %v", q)
	}

	for _, tc := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"clear-quarantine", "--data-dir", dir}, 2, "", "compass-server: --runner-id is required\n"},
		{[]string{"clear-quarantine", "--runner-id", "other", "--data-dir", dir}, 1, "", "compass-server: server: clear quarantine: store: not found: runner \"other\" is not quarantined\n"},
		{[]string{"clear-quarantine", "--runner-id", "build-01", "--data-dir", dir}, 0,
			"cleared the quarantine of \"build-01\" (since " + at + ", 2 displacements, last between 10.0.0.2:40000 and 10.0.0.1:50000); compass-callout lets it connect at its next poll\n", ""},
		{[]string{"clear-quarantine", "--runner-id", "build-01", "--data-dir", dir}, 1, "", "compass-server: server: clear quarantine: store: not found: runner \"build-01\" is not quarantined\n"},
	} {
		if code, stdout, stderr := runServer(t, nil, tc.args...); code != tc.code || stdout != tc.stdout || stderr != tc.errs {
			t.Fatalf("%q: code %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, stdout, stderr, tc.code, tc.stdout, tc.errs)
		}
	}
	if code, stdout, _ := runServer(t, nil, "runners", "--data-dir", dir); code != 0 || strings.Contains(stdout, "QUARANTINED") {
		t.Fatalf("runners after clear-quarantine: code %d:\n%s", code, stdout)
	}
}
