package commands_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// The daemons' flags of each type, refused from the command line and from
// the environment: one line naming the source as written, the value and
// what is accepted, exit 2. A value a command refuses after parsing (--ttl
// under the minimum) and a URL a library refuses name the variable too.
func TestDaemonFlagErrorsNameTheirSource(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prog     *cli.Command
		args     []string // before the flag
		flag     string
		value    string
		want     string // after "<source> <value>: " or "<source>=<value>: "
		exitCode int
	}{
		{"duration", commands.Runner, nil, "heartbeat", "5", "want a duration such as 30s", cli.ExitUsage},
		{"duration of a command", commands.Server, []string{"mint-account-token", "--name", "ops"}, "ttl", "banana", "want a duration such as 30s", cli.ExitUsage},
		{"int", commands.Callout, nil, "workers", "many", "want a whole number such as 4", cli.ExitUsage},
		{"int out of range", commands.Callout, nil, "connections", "99999999999999999999", "want a whole number from -9223372036854775808 to 9223372036854775807", cli.ExitUsage},
		{"bool", commands.Callout, nil, "no-kick", "maybe", "want true or false", cli.ExitUsage},
		{"enum of a library", commands.Callout, nil, "duplicates", "both", "want kick-older or keep", cli.ExitUsage},
		{"log format", commands.Runner, nil, "log-format", "xml", "want json or text", cli.ExitUsage},
		{"log level", commands.Server, []string{"serve"}, "log-level", "loud", "want debug, info, warn or error", cli.ExitUsage},
		{"output", commands.Server, []string{"list-tokens"}, "output", "yaml", "want table or json", cli.ExitUsage},
		{"manifests int", commands.Server, []string{"manifests"}, "callout-replicas", "x", "want a whole number such as 4", cli.ExitUsage},
	} {
		for _, source := range []string{"flag", "env"} {
			t.Run(tc.name+" by "+source, func(t *testing.T) {
				args := slices.Clone(tc.args)
				var env map[string]string
				want := fmt.Sprintf("%s: --%s %s: %s\n", tc.prog.Name, tc.flag, tc.value, tc.want)
				if source == "flag" {
					args = append(args, "--"+tc.flag+"="+tc.value)
				} else {
					env = map[string]string{cli.EnvName(tc.flag): tc.value}
					want = fmt.Sprintf("%s: %s=%s: %s\n", tc.prog.Name, cli.EnvName(tc.flag), tc.value, tc.want)
				}
				code, stdout, stderr := runStopped(t, tc.prog, env, args...)
				if code != tc.exitCode || stdout != "" || stderr != want {
					t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout, stderr, tc.exitCode, want)
				}
			})
		}
	}

	dir := migrated(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"TTL refused after parsing, by flag", nil, []string{"mint-runner-token", "--runner-id", "r1", "--data-dir", dir, "--ttl", "0s"},
			"compass-server: --ttl 0s: must be positive (leave --ttl out for a token that does not expire)\n"},
		{"TTL refused after parsing, by variable", map[string]string{"COMPASS_TTL": "0s"}, []string{"mint-runner-token", "--runner-id", "r1", "--data-dir", dir},
			"compass-server: COMPASS_TTL=0s: must be positive (leave --ttl out for a token that does not expire)\n"},
		{"door URL by flag", map[string]string{"COMPASS_TOKEN": "x"}, []string{"runners", "--server", "http://door:8443"},
			"compass-server: --server \"http://door:8443\": must be https:// (a token goes with every call): --server must be an https:// URL\n"},
		{"door URL by variable", map[string]string{"COMPASS_TOKEN": "x", "COMPASS_SERVER": "http://door:8443"}, []string{"runners"},
			"compass-server: --server \"http://door:8443\": must be https:// (a token goes with every call): --server must be an https:// URL (--server was read from COMPASS_SERVER)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runServer(t, tc.env, tc.args...)
			if code != cli.ExitUsage || stdout != "" || stderr != tc.want {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and %q", code, stdout, stderr, tc.want)
			}
		})
	}
}

// tokenKeys and runnerKeys are the documented --output json schemas
// (docs/server.md, "Machine-readable output"): every key always present.
var (
	tokenKeys  = []string{"created_at", "expires_at", "id", "kind", "revoked_at", "subject"}
	runnerKeys = []string{"cluster", "first_enrolled_at", "hostname", "id", "last_enrolled_at", "last_seen_at",
		"method", "node_name", "node_uid", "pod_name", "pod_uid", "version"}
)

// decodeList decodes --output json's one object {"<key>": [...]}, checking
// that it has that key alone and that every element has exactly keys.
func decodeList(t *testing.T, out, key string, keys []string) []map[string]any {
	t.Helper()
	var top map[string][]map[string]any
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		t.Fatalf("--output json is no {%q: [...]} object: %v\n%s", key, err, out)
	}
	if len(top) != 1 || top[key] == nil {
		t.Fatalf("--output json has keys %v, want %q alone:\n%s", top, key, out)
	}
	for _, e := range top[key] {
		if got := slices.Sorted(maps.Keys(e)); !slices.Equal(got, keys) {
			t.Fatalf("an element has keys %v, want %v", got, keys)
		}
	}
	return top[key]
}

// rfc3339 is t as --output json writes it; nil for the zero time.
func rfc3339(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339)
}

// list-tokens --output json lists what the table lists, in the documented
// schema, and no token or hash: a live token, one with a TTL, a revoked
// one.
func TestListTokensOutputJSON(t *testing.T) {
	dir := migrated(t)
	var secrets []string
	for _, args := range [][]string{
		{"mint-runner-token", "--runner-id", "build-01"},
		{"mint-account-token", "--name", "ops", "--ttl", "24h"},
		{"mint-runner-token", "--runner-id", "old-host"},
	} {
		code, stdout, stderr := runServer(t, nil, append(args, "--data-dir", dir)...)
		if code != 0 {
			t.Fatalf("%v: %s", args, stderr)
		}
		secrets = append(secrets, strings.TrimSpace(stdout))
	}
	st := servertest.OpenStore(t, dir)
	infos, err := st.ListTokens(t.Context())
	if err != nil || len(infos) != 3 {
		t.Fatalf("ListTokens: %v, %v", infos, err)
	}
	if _, err := st.Revoke(t.Context(), infos[2].ID); err != nil {
		t.Fatal(err)
	}
	if infos, err = st.ListTokens(t.Context()); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runServer(t, nil, "list-tokens", "--data-dir", dir, "--output", "json")
	if code != 0 || stderr != "" {
		t.Fatalf("list-tokens --output json: exit %d, stderr %q", code, stderr)
	}
	got := decodeList(t, stdout, "tokens", tokenKeys)
	if len(got) != len(infos) {
		t.Fatalf("%d tokens in JSON, %d in the store", len(got), len(infos))
	}
	for i, info := range infos {
		want := map[string]any{"id": info.ID, "kind": info.Kind.String(), "subject": info.SubjectID,
			"created_at": rfc3339(info.CreatedAt), "expires_at": rfc3339(info.ExpiresAt), "revoked_at": rfc3339(info.RevokedAt)}
		for k, v := range want {
			if got[i][k] != v {
				t.Errorf("token %d: %s = %v, want %v", i, k, got[i][k], v)
			}
		}
	}
	if got[0]["expires_at"] != nil || got[1]["expires_at"] == nil || got[2]["revoked_at"] == nil || got[0]["revoked_at"] != nil {
		t.Fatalf("the expiry and the revocation are not where they were set: %v", got)
	}
	for _, tok := range secrets {
		sum := sha256.Sum256([]byte(tok))
		for _, s := range []string{tok, hex.EncodeToString(sum[:]), base64.StdEncoding.EncodeToString(sum[:]), base64.RawURLEncoding.EncodeToString(sum[:])} {
			if strings.Contains(stdout, s) {
				t.Fatal("list-tokens --output json shows a token or its hash")
			}
		}
	}
	// The same from COMPASS_OUTPUT, and the table by default.
	if code, out, _ := runServer(t, map[string]string{"COMPASS_OUTPUT": "json"}, "list-tokens", "--data-dir", dir); code != 0 || out != stdout {
		t.Fatalf("COMPASS_OUTPUT=json: exit %d, output differs:\n%s", code, out)
	}
	if code, out, _ := runServer(t, nil, "list-tokens", "--data-dir", dir); code != 0 || !strings.HasPrefix(out, "ID ") {
		t.Fatalf("list-tokens: exit %d, not the table:\n%s", code, out)
	}
	// No tokens: an empty list, not null.
	empty := migrated(t)
	if code, out, _ := runServer(t, nil, "list-tokens", "--data-dir", empty, "--output", "json"); code != 0 || out != "{\n  \"tokens\": []\n}\n" {
		t.Fatalf("no tokens: exit %d, %q", code, out)
	}
}

// runners --output json, from the database: a minted Runner (no cluster,
// node or pod: null) and a projected one, seen and never seen.
func TestRunnersOutputJSON(t *testing.T) {
	dir := migrated(t)
	st := servertest.OpenStore(t, dir)
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, e := range []store.Enrollment{
		{RunnerID: "build-01", Method: store.MethodMinted, Version: "v1.2.3", Hostname: "build-host", At: at},
		{RunnerID: "prod/node-a", Method: store.MethodProjected, Cluster: "prod", NodeName: "node-a", NodeUID: "uid-a", PodName: "runner-x", PodUID: "pod-uid", At: at.Add(time.Minute)},
	} {
		if _, err := st.RecordEnrollment(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.TouchRunner(t.Context(), "build-01", at.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	rs, err := st.ListRunners(t.Context())
	if err != nil || len(rs) != 2 {
		t.Fatalf("ListRunners: %v, %v", rs, err)
	}
	code, stdout, stderr := runServer(t, nil, "runners", "--data-dir", dir, "--output", "json")
	if code != 0 || stderr != "" {
		t.Fatalf("runners --output json: exit %d, stderr %q", code, stderr)
	}
	got := decodeList(t, stdout, "runners", runnerKeys)
	if len(got) != 2 {
		t.Fatalf("%d Runners in JSON, want 2", len(got))
	}
	str := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	for i, r := range rs {
		want := map[string]any{"id": r.ID, "method": r.Method, "cluster": str(r.Cluster), "node_name": str(r.NodeName),
			"node_uid": str(r.NodeUID), "pod_name": str(r.PodName), "pod_uid": str(r.PodUID), "version": str(r.Version),
			"hostname": str(r.Hostname), "first_enrolled_at": rfc3339(r.FirstEnrolledAt), "last_enrolled_at": rfc3339(r.LastEnrolledAt),
			"last_seen_at": rfc3339(r.LastSeenAt)}
		for k, v := range want {
			if got[i][k] != v {
				t.Errorf("Runner %s: %s = %v, want %v", r.ID, k, got[i][k], v)
			}
		}
	}
	byID := map[string]map[string]any{}
	for _, r := range got {
		byID[r["id"].(string)] = r
	}
	if m, p := byID["build-01"], byID["prod/node-a"]; m["cluster"] != nil || m["last_seen_at"] != "2026-12-03T12:02:00Z" ||
		p["node_uid"] != "uid-a" || p["last_seen_at"] != nil || p["first_enrolled_at"] != "2026-12-03T12:01:00Z" {
		t.Fatalf("the Runners' fields: %v", got)
	}
}

// backup --to - writes the copy alone on stdout (a database the store
// opens, with the token minted before), the message on stderr, and leaves
// no file behind; /dev/stdout is the same.
func TestBackupToStdout(t *testing.T) {
	dir := migrated(t)
	tok := mintRunnerToken(t, dir, "build-01")
	_ = servertest.OpenStore(t, dir) // held open: the backup is taken beside a user
	before := listDir(t, dir)
	for _, to := range []string{"-", "/dev/stdout"} {
		code, stdout, stderr := runServer(t, nil, "backup", "--data-dir", dir, "--to", to)
		want := fmt.Sprintf("backed up the SQLite database %s (schema version %d) to stdout\n", filepath.Join(dir, "compass.db"), store.SchemaVersionWanted())
		if code != 0 || stderr != want {
			t.Fatalf("backup --to %s: exit %d, stderr %q; want %q", to, code, stderr, want)
		}
		if !strings.HasPrefix(stdout, "SQLite format 3\x00") {
			t.Fatalf("backup --to %s: stdout is no SQLite database (%d bytes)", to, len(stdout))
		}
		cpPath := filepath.Join(t.TempDir(), "copy.db")
		writeFile(t, cpPath, stdout)
		cp, err := store.OpenCurrent(t.Context(), "sqlite://"+cpPath)
		if err != nil {
			t.Fatal(err)
		}
		s, err := verifier.NewResolver(nil, cp).Resolve(t.Context(), tok, verifier.SubjectRunner)
		_ = cp.Close()
		if err != nil || s.ID != "build-01" {
			t.Fatalf("the token in the streamed copy: %+v, %v", s, err)
		}
		if after := listDir(t, dir); !slices.Equal(after, before) {
			t.Fatalf("backup --to %s left files: %v, before %v", to, after, before)
		}
	}
	// PostgreSQL is backed up with pg_dump: refused, nothing written.
	code, stdout, stderr := runServer(t, nil, "backup", "--database-url", "postgres://u@127.0.0.1:1/db", "--to", "-")
	if code != 1 || stdout != "" || stderr != "compass-server: server: store: backup: a PostgreSQL database is backed up with pg_dump -Fc and restored with pg_restore\n" {
		t.Fatalf("backup --to - of PostgreSQL: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
