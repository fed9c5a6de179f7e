//go:build nodetier

package node

// The PostgreSQL layout's database (helm_test.go, TestNodeHelmPostgres): a
// PostgreSQL the pods reach at the node's address, the roles docs/store.md
// makes, and its backup.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/compass-runner/identity/test/helm"
)

// The Secrets (key url) the PostgreSQL layout's values name.
const (
	serverDBSecret  = "compass-server-database"
	calloutDBSecret = "compass-callout-database"
)

// nodePostgres is a PostgreSQL the pods reach at the node's address: the
// repository's .ci/postgres.sh with its data beside the node's directory,
// listening on the node's address beside loopback, the pods' network let in
// with a password. .ci/node.sh down stops it with the node.
type nodePostgres struct {
	bin, host             string
	port                  int
	serverURL, calloutURL string
	// afterMigrate are the guide's statements on tables the migrations
	// create.
	afterMigrate []string
}

func (e *env) startPostgres(t *testing.T) (*nodePostgres, error) {
	t.Helper()
	ctx := t.Context()
	root := helm.RepoRoot(t)
	// Beside the node's directory, not in it: that one is the root's alone
	// (0700), and the server runs as the postgres user.
	dir := e.dir + "-postgres"
	env := append(os.Environ(), "COMPASS_PG_DIR="+dir, "COMPASS_PG_LISTEN="+e.nodeIP, "COMPASS_PG_CLIENTS="+e.podCIDR)
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, ".ci", "postgres.sh"))
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("test/node: .ci/postgres.sh: %w\n%s", err, errb.String())
	}
	t.Cleanup(func() {
		stop := exec.Command("bash", filepath.Join(root, ".ci", "postgres.sh"), "stop")
		stop.Env = env
		_ = stop.Run()
	})
	m := regexp.MustCompile(`@127\.0\.0\.1:([0-9]+)/`).FindStringSubmatch(out.String())
	if m == nil {
		return nil, fmt.Errorf("test/node: .ci/postgres.sh printed no URL")
	}
	db := &nodePostgres{host: e.nodeIP}
	db.port, _ = strconv.Atoi(m[1])
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	if len(bins) == 0 {
		return nil, errors.New("test/node: no psql under /usr/lib/postgresql")
	}
	slices.Sort(bins)
	db.bin = filepath.Dir(bins[len(bins)-1])

	// The Server's owning role and database, then compass-callout's role
	// with docs/store.md's own statements (its sql block, the password put
	// in), before the migrate Job creates the tables.
	pw := func() string {
		b := make([]byte, 24)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	ownerPW, calloutPW := pw(), pw()
	if err := db.psql(ctx, "postgres", "CREATE ROLE compass LOGIN PASSWORD '"+ownerPW+"'", "CREATE DATABASE compass OWNER compass"); err != nil {
		return nil, err
	}
	stmts, err := calloutRoleSQL(filepath.Join(root, "docs", "store.md"), calloutPW)
	if err != nil {
		return nil, err
	}
	// A grant on a table a migration creates runs once the migrate Job has
	// made it, as the guide's comment on it says.
	var before []string
	for _, q := range stmts {
		if strings.Contains(q, "runner_quarantine") {
			db.afterMigrate = append(db.afterMigrate, q)
		} else {
			before = append(before, q)
		}
	}
	if err := db.psql(ctx, "compass", before...); err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(db.host, strconv.Itoa(db.port))
	db.serverURL = "postgres://compass:" + ownerPW + "@" + addr + "/compass?sslmode=disable"
	db.calloutURL = "postgres://compass_callout:" + calloutPW + "@" + addr + "/compass?sslmode=disable"
	return db, nil
}

// psql runs statements as the administrator, over loopback.
func (db *nodePostgres) psql(ctx context.Context, database string, stmts ...string) error {
	if len(stmts) == 0 {
		return nil // psql with no -c would read its standard input
	}
	args := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(db.port), "-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-q"}
	for _, q := range stmts {
		args = append(args, "-c", q)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(db.bin, "psql"), args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		// The statements hold passwords: only psql's own message.
		return fmt.Errorf("test/node: psql: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	return nil
}

// secrets are the two Secrets the values name, as docs/store.md has the
// operator make them.
func (db *nodePostgres) secrets(ctx context.Context, e *env) error {
	for name, u := range map[string]string{serverDBSecret: db.serverURL, calloutDBSecret: db.calloutURL} {
		if _, err := e.cs.CoreV1().Secrets(systemNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string][]byte{"url": []byte(u)}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// dump is docs/store.md's PostgreSQL backup, pg_dump in its custom format;
// it returns the dump's size.
func (db *nodePostgres) dump(t *testing.T) int {
	t.Helper()
	out := filepath.Join(t.TempDir(), "compass.dump")
	cmd := exec.CommandContext(t.Context(), filepath.Join(db.bin, "pg_dump"), "-h", "127.0.0.1", "-p", strconv.Itoa(db.port), "-U", "postgres", "-Fc", "-f", out, "compass")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("pg_dump: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Size())
}

// calloutRoleSQL reads the statements of docs/store.md's "compass-callout's
// read-only role" sql block, the password in place of '...', so that the
// guide's own SQL is what makes the role here.
func calloutRoleSQL(doc, password string) ([]string, error) {
	b, err := os.ReadFile(doc)
	if err != nil {
		return nil, err
	}
	text := string(b)
	i := strings.Index(text, "### compass-callout's read-only role")
	if i < 0 {
		return nil, fmt.Errorf("test/node: %s has no section \"compass-callout's read-only role\"", doc)
	}
	text = text[i:]
	from := strings.Index(text, "```sql\n")
	if from < 0 {
		return nil, fmt.Errorf("test/node: %s: no sql block in the callout's role section", doc)
	}
	text = text[from+len("```sql\n"):]
	text = text[:strings.Index(text, "```")]
	var stmts []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		stmts = append(stmts, strings.TrimSuffix(strings.ReplaceAll(line, "'...'", "'"+password+"'"), ";"))
	}
	if len(stmts) == 0 || !strings.HasPrefix(stmts[0], "CREATE ROLE compass_callout") {
		return nil, fmt.Errorf("test/node: %s: the callout's role SQL does not start with CREATE ROLE compass_callout", doc)
	}
	return stmts, nil
}
