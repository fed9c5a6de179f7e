package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"
)

// Limits on BackupToDir's retention, each with its reason.
const (
	// MinBackupKeep: a scheduled backup that removed every copy, its own
	// among them, would leave nothing to restore.
	MinBackupKeep = 1
	// MaxBackupKeep bounds how many copies one directory holds: a daily
	// schedule keeps close to three years at the most; more is a mistyped
	// number filling the volume.
	MaxBackupKeep = 1000
)

// backupNameRE matches the names BackupName gives, and nothing else:
// retention never touches a file it did not name.
var backupNameRE = regexp.MustCompile(`^compass-[0-9]{8}T[0-9]{6}Z\.db$`)

// BackupName is the file name BackupToDir gives a copy taken at t:
// compass-20261203T030000Z.db. Names sort as the times do.
func BackupName(t time.Time) string {
	return "compass-" + t.UTC().Format("20060102T150405Z") + ".db"
}

// DirBackup is what BackupToDir did.
type DirBackup struct {
	File          string   // the new copy's path
	SchemaVersion int      // the copy's schema version
	Removed       []string // older copies removed by retention, oldest first
}

// BackupToDir copies the SQLite database a URL names into dir as
// BackupName(now) (the store's clock: WithClock), as Backup does (consistent
// while a Server writes, created 0600, never overwriting), then removes the
// oldest copies named by BackupName beyond keep, the new one counted. It is
// what a scheduled backup runs (compass-server backup --to-dir, the rendered
// CronJob). Retention runs only after the new copy is whole, so a failed
// backup never costs an old one.
func BackupToDir(ctx context.Context, url, dir string, keep int, opts ...Option) (DirBackup, error) {
	if keep < MinBackupKeep || keep > MaxBackupKeep {
		return DirBackup{}, fmt.Errorf("store: backup: keep %d is not from %d to %d", keep, MinBackupKeep, MaxBackupKeep)
	}
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return DirBackup{}, fmt.Errorf("store: backup: %w", err)
	}
	if !fi.IsDir() {
		return DirBackup{}, fmt.Errorf("store: backup: %s is not a directory", dir)
	}
	res := DirBackup{File: filepath.Join(dir, BackupName(o.now()))}
	if res.SchemaVersion, err = Backup(ctx, url, res.File); err != nil {
		return DirBackup{}, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return res, fmt.Errorf("store: backup: the copy is made (%s), but its directory cannot be listed for retention: %w", res.File, err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && backupNameRE.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	var errs []error
	for len(names) > keep {
		p := filepath.Join(dir, names[0])
		names = names[1:]
		if p == res.File {
			continue // never the copy just made (a clock set back)
		}
		if err := os.Remove(p); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Removed = append(res.Removed, p)
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("store: backup: the copy is made (%s), but retention failed: %w", res.File, err)
	}
	return res, nil
}
