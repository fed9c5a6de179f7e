package testlog

import (
	"log/slog"
	"testing"
)

func TestJSONRecords(t *testing.T) {
	var b Buffer
	log := slog.New(slog.NewJSONHandler(&b, nil))
	log.Info("a", "n", 1)
	log.Warn("b")
	log.Info("a", "n", 2)
	recs, err := b.JSONRecords("a")
	if err != nil || len(recs) != 2 || recs[0]["n"] != 1.0 || recs[1]["n"] != 2.0 {
		t.Fatalf("records %v, %v", recs, err)
	}
	_, _ = b.Write([]byte("not json\n"))
	if _, err := b.JSONRecords("a"); err == nil {
		t.Fatal("a line that is no JSON was read as a record")
	}
}
