package deploy_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/store"
)

// migrateJobContainer renders p's migrate Job (--migrate-job) and returns its
// one container.
func migrateJobContainer(t *testing.T, p deploy.Params) corev1.Container {
	t.Helper()
	out, err := deploy.RenderMigrateJob(p)
	if err != nil {
		t.Fatal(err)
	}
	var job batchv1.Job
	if err := yaml.UnmarshalStrict(bytes.TrimPrefix(out, []byte("\n---\n")), &job); err != nil {
		t.Fatal(err)
	}
	if len(job.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("migrate Job containers = %d", len(job.Spec.Template.Spec.Containers))
	}
	return job.Spec.Template.Spec.Containers[0]
}

// runContainer runs compass-server with c's arguments and env.
func runContainer(t *testing.T, c corev1.Container, env map[string]string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = cli.Run(t.Context(), commands.Server, c.Args, func(k string) string { return env[k] }, &o, &e)
	return code, o.String(), e.String()
}

// The migration policy as the manifests carry it, run with the rendered
// containers' own environment on both backends: the Server pod's init
// container (check-schema) refuses a database behind its image and says to
// back up and migrate, changing nothing; the migrate Job, rendered apart,
// migrates it; the init container then passes, and the Job run again has
// nothing to do. On SQLite a volume without a database passes the check
// (serve creates the file on its first start); an empty PostgreSQL database
// does not (the Job runs before the first Server).
func TestMigrationPolicyAsRendered(t *testing.T) {
	wanted := store.SchemaVersionWanted()
	for _, tc := range []struct {
		name, dbSecret string
	}{
		{"SQLite", ""},
		{"PostgreSQL", "compass-server-database"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, secrets := serverTopology(t, tc.dbSecret, "migratejob")
			files := podFiles{t, t.TempDir(), deploy.ServerName}
			check := container(t, serverPod(t, p), "check-schema")
			job := migrateJobContainer(t, p)
			checkEnv := containerEnv(t, files, check, "", secrets)
			jobEnv := containerEnv(t, files, job, "", secrets)

			db := "the PostgreSQL database"
			if tc.dbSecret == "" {
				path := filepath.Join(checkEnv["COMPASS_DATA_DIR"], "compass.db")
				db = "the SQLite database " + path
				// A new volume: the check passes and creates nothing.
				code, stdout, stderr := runContainer(t, check, checkEnv)
				want := fmt.Sprintf("%s does not exist yet: serve creates it at schema version %d\n", db, wanted)
				if code != 0 || stdout != want {
					t.Fatalf("check-schema on a new volume: code %d, stdout %q, stderr %q; want 0 and %q", code, stdout, stderr, want)
				}
				if _, err := os.Stat(path); err == nil {
					t.Fatal("check-schema created the database")
				}
				// A database no release has migrated yet.
				if err := os.WriteFile(path, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			code, stdout, stderr := runContainer(t, check, checkEnv)
			want := fmt.Sprintf("has no schema yet (version 0) and this binary wants %d: run compass-server migrate (back up the database first: docs/store.md, Upgrading)\n", wanted)
			if code != 1 || stdout != "" || !strings.HasPrefix(stderr, "compass-server: server: check-schema: store: the ") || !strings.HasSuffix(stderr, want) {
				t.Fatalf("check-schema on a database behind: code %d, stdout %q, stderr %q; want 1 and ...%q", code, stdout, stderr, want)
			}

			code, stdout, stderr = runContainer(t, job, jobEnv)
			if code != 0 || !strings.HasPrefix(stdout, "migrated "+db) || !strings.HasSuffix(stdout, fmt.Sprintf(" from schema version 0 to %d\n", wanted)) {
				t.Fatalf("the migrate Job: code %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			code, stdout, stderr = runContainer(t, check, checkEnv)
			if code != 0 || !strings.HasPrefix(stdout, db) || !strings.HasSuffix(stdout, fmt.Sprintf(" is at schema version %d, this binary's\n", wanted)) {
				t.Fatalf("check-schema after the Job: code %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			code, stdout, _ = runContainer(t, job, jobEnv)
			if code != 0 || !strings.HasSuffix(stdout, fmt.Sprintf(" is at schema version %d: nothing to migrate\n", wanted)) {
				t.Fatalf("the migrate Job again: code %d, stdout %q", code, stdout)
			}
		})
	}
}
