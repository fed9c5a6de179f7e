package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/runner"
	"github.com/compass-runner/identity/runner/enroll"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// topologyWait bounds each daemon's start and the first enrollment.
const topologyWait = 30 * time.Second

// podFiles stands in for a pod's volumes: every volume of a pod is one
// directory, so two containers that mount the same volume see the same
// files, and a path a container's environment names is found only if one of
// its mounts holds it.
type podFiles struct {
	t    *testing.T
	root string
	pod  string
}

// remap turns a path inside container c into the directory standing in for
// the volume mounted there, failing the test when no mount of c holds it.
func (f podFiles) remap(c corev1.Container, path string) string {
	f.t.Helper()
	for _, m := range c.VolumeMounts {
		rest, ok := strings.CutPrefix(path, m.MountPath+"/")
		if path == m.MountPath {
			rest, ok = ".", true
		}
		if ok {
			dir := filepath.Join(f.root, f.pod, m.Name)
			if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(rest)), 0o700); err != nil {
				f.t.Fatal(err)
			}
			return filepath.Join(dir, rest)
		}
	}
	f.t.Fatalf("%s: %s is on none of its volumes %v", c.Name, path, c.VolumeMounts)
	return ""
}

// containerEnv is the environment the kubelet would give c, with every path
// moved onto the pod's stand-in volumes, the addresses moved to free
// loopback ports, the NATS URL pointed at natsURL, and Secret keys read from
// secrets (a key the test does not provide fails it, as a missing Secret
// keeps the pod from starting).
func containerEnv(t *testing.T, f podFiles, c corev1.Container, natsURL string, secrets map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			k := e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			v, ok := secrets[k]
			if !ok {
				t.Fatalf("%s: %s reads Secret key %s, which this topology does not have", c.Name, e.Name, k)
			}
			env[e.Name] = v
		case e.ValueFrom != nil:
			// The pod's IP: only used inside COMPASS_METRICS_ADDR, moved below.
		case e.Name == "COMPASS_METRICS_ADDR", e.Name == "COMPASS_LISTEN":
			env[e.Name] = testutil.FreeAddr(t)
		case e.Name == "COMPASS_NATS_URL":
			env[e.Name] = natsURL
		case strings.HasPrefix(e.Value, "sqlite://"):
			env[e.Name] = "sqlite://" + f.remap(c, strings.TrimPrefix(e.Value, "sqlite://"))
		case strings.HasPrefix(e.Value, "/"):
			env[e.Name] = f.remap(c, e.Value)
		default:
			env[e.Name] = e.Value
		}
	}
	return env
}

// container finds the container name in spec.
// serverTopology renders the Server on SQLite (dbSecret empty) or on
// PostgreSQL (the Secret dbSecret), and returns the parameters and the
// Secrets the pods read: on PostgreSQL, dbSecret's url, a fresh schema
// named after schema in the test database.
func serverTopology(t *testing.T, dbSecret, schema string) (deploy.Params, map[string]string) {
	t.Helper()
	p := deploy.DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	p.ServerDatabaseSecret = dbSecret
	secrets := map[string]string{}
	if dbSecret != "" {
		p.DatabaseCIDR = "10.20.0.0/16"
		secrets[dbSecret+"/url"] = storetest.PostgresSchema(t, schema)
	}
	return p, secrets
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func writeSecretFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// runProgram runs prog with args and env until ctx ends, as its container
// would, and returns the channel its exit code arrives on.
func runProgram(ctx context.Context, prog *cli.Command, args []string, env map[string]string, stdout, stderr io.Writer) <-chan int {
	done := make(chan int, 1)
	go func() { done <- cli.Run(ctx, prog, args, func(k string) string { return env[k] }, stdout, stderr) }()
	return done
}

// Each topology the manifests render for an in-cluster Server, run with the
// rendered containers' own environment (paths on stand-in volumes shared as
// the pod shares them, the database a real SQLite file or PostgreSQL
// schema): the schema is made as the manifests make it, compass-server serve
// and compass-callout run on an in-process nats-server configured as the
// rendered one is (server-config callout, xkey, the three auth_users), a
// Runner token is minted with mint-runner-token in the Server's container,
// and that token enrolls at the door and is then accepted at NATS CONNECT
// with its Runner ID and subjects. On SQLite that works only because the
// callout runs in the Server's pod with the Server's volume: the third case
// runs the callout without the file, as a Deployment of its own would, and
// the same token, enrolled at the door, is refused at CONNECT with "no
// minted-token store" in the callout's log.
func TestRenderedTopologiesAcceptMintedTokensAtBothDoors(t *testing.T) {
	for _, tc := range []struct {
		name, dbSecret string
		// noStore runs the callout without its database: the callout of
		// the SQLite topology before DL-452, a Deployment with no way to
		// the Server's file. The token must then be refused at CONNECT,
		// which shows what the other two cases prove is not a given.
		noStore bool
	}{
		{"SQLite, the callout in the Server's pod", "", false},
		{"PostgreSQL, the callout's own Deployment", "compass-server-database", false},
		{"SQLite, a callout without the Server's file", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, secrets := serverTopology(t, tc.dbSecret, "topology")
			serverSpec := serverPod(t, p)
			calloutSpec, calloutPod := serverSpec, deploy.ServerName
			if tc.dbSecret != "" {
				calloutSpec, calloutPod = renderedPod(t, p, "Deployment", "compass-callout"), "compass-callout"
			}
			root := t.TempDir()

			// NATS as rendered: the callout's issuer and xkey, the three users
			// that bypass it, the Runners' account.
			issuer, err := nkeys.CreateAccount()
			if err != nil {
				t.Fatal(err)
			}
			issuerPub, _ := issuer.PublicKey()
			issuerSeed, _ := issuer.Seed()
			xk, err := nkeys.CreateCurveKeys()
			if err != nil {
				t.Fatal(err)
			}
			xkPub, _ := xk.PublicKey()
			xkSeed, _ := xk.Seed()
			pw := map[string]string{"compass-callout": "callout-pw", "compass-server": "server-pw", "compass-kick": "kick-pw"}
			ns := natsembed.Serve(t, fmt.Sprintf(`
listen: "127.0.0.1:-1"
accounts {
  CALLOUT { users: [ { user: compass-callout, password: %q } ] }
  %s { users: [ { user: compass-server, password: %q } ] }
  SYS { users: [ { user: compass-kick, password: %q, permissions: { publish: { allow: [ %q, %q, %q ] }, subscribe: { allow: [ "_INBOX.>" ] } } } ] }
}
system_account: SYS
authorization { auth_callout { issuer: %s, account: CALLOUT, auth_users: [ compass-callout, compass-server, compass-kick ], xkey: %s } }
`, pw["compass-callout"], p.NATSAccount, pw["compass-server"], pw["compass-kick"],
				kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick, issuerPub, xkPub), nil)

			serverFiles := podFiles{t, root, deploy.ServerName}
			calloutFiles := podFiles{t, root, calloutPod}
			srv := container(t, serverSpec, "server")
			co := container(t, calloutSpec, "callout")
			senv := containerEnv(t, serverFiles, srv, ns.ClientURL(), secrets)
			cenv := containerEnv(t, calloutFiles, co, ns.ClientURL(), secrets)

			// What the Secrets and ConfigMaps would hold, at the paths the
			// containers read them from.
			_, _, caFile := servertest.TLS(t, t.TempDir())
			certDir := filepath.Dir(caFile)
			for k, name := range map[string]string{"COMPASS_TLS_CERT": "tls.crt", "COMPASS_TLS_KEY": "tls.key"} {
				b, err := os.ReadFile(filepath.Join(certDir, name))
				if err != nil {
					t.Fatal(err)
				}
				writeSecretFile(t, senv[k], string(b))
			}
			// A registered cluster with usable keys, so the callout is ready
			// with or without a store (readiness wants one or the other).
			clusters := "clusters:\n" + verifiertest.ClusterEntry(t, testkeys.Issuer(t), t.TempDir(), "prod")
			if tc.noStore {
				delete(cenv, "COMPASS_DATABASE_URL")
			}
			for _, env := range []map[string]string{senv, cenv} {
				writeSecretFile(t, env["COMPASS_RUNNER_CLUSTERS"], clusters)
				writeSecretFile(t, env["COMPASS_NATS_PASSWORD_FILE"], pw[env["COMPASS_NATS_USER"]]+"\n")
			}
			writeSecretFile(t, cenv["COMPASS_ISSUER_SEED_FILE"], string(issuerSeed))
			writeSecretFile(t, cenv["COMPASS_XKEY_SEED_FILE"], string(xkSeed))
			writeSecretFile(t, cenv["COMPASS_KICK_PASSWORD_FILE"], pw[cenv["COMPASS_KICK_USER"]]+"\n")

			// The schema, as the manifests make it.
			migrateSchema(t, p, serverFiles, ns.ClientURL(), secrets)

			ctx, cancel := context.WithCancel(t.Context())
			var serverLog, calloutLog testlog.Buffer
			serverDone := runProgram(ctx, commands.Server, srv.Args, senv, io.Discard, &serverLog)
			calloutDone := runProgram(ctx, commands.Callout, co.Args, cenv, io.Discard, &calloutLog)
			defer func() {
				cancel()
				for name, done := range map[string]<-chan int{"serve": serverDone, "compass-callout": calloutDone} {
					if code := <-done; code != 0 {
						t.Errorf("%s exited %d", name, code)
					}
				}
			}()
			testutil.Eventually(t, topologyWait, "the callout ready", func() bool {
				res, err := http.Get("http://" + cenv["COMPASS_METRICS_ADDR"] + "/readyz")
				if err != nil {
					return false
				}
				res.Body.Close()
				return res.StatusCode == http.StatusOK
			})

			// mint-runner-token in the Server's container (kubectl exec).
			var out, errOut bytes.Buffer
			if code := cli.Run(t.Context(), commands.Server, []string{"mint-runner-token", "--runner-id", "build-01"},
				func(k string) string { return senv[k] }, &out, &errOut); code != 0 {
				t.Fatalf("mint-runner-token exited %d: %s", code, errOut.String())
			}
			token := strings.TrimSpace(out.String())

			doorURL := "https://" + senv["COMPASS_LISTEN"]
			e, err := enroll.New(enroll.Config{ServerURL: doorURL, CAFile: caFile, Tokens: runner.StaticToken(token),
				Retry:  runner.Retry{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond},
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ectx, ecancel := context.WithTimeout(t.Context(), topologyWait)
			defer ecancel()
			res, err := e.Enroll(ectx, runner.EnrollRequest{Version: "test", Hostname: "h"})
			if err != nil || res.RunnerID != "build-01" {
				t.Fatalf("Enroll = %+v, %v; want build-01\nserver log:\n%s", res, err, serverLog.String())
			}

			inbox, _ := subjects.InboxPrefix(res.RunnerID)
			nc, err := nats.Connect(ns.ClientURL(), nats.Token(token), nats.CustomInboxPrefix(inbox), nats.Timeout(5*time.Second))
			if tc.noStore {
				if !errors.Is(err, nats.ErrAuthorization) {
					t.Fatalf("NATS CONNECT with a minted token, the callout without a store: %v, want an authorization violation", err)
				}
				// The callout logs its reason once the answer is sent: wait for it.
				testutil.Eventually(t, topologyWait, "the callout saying why it refused (no minted-token store)", func() bool {
					return strings.Contains(calloutLog.String(), "no minted-token store")
				})
				return
			}
			if err != nil {
				t.Fatalf("NATS CONNECT with the minted token: %v\ncallout log:\n%s", err, calloutLog.String())
			}
			defer nc.Close()
			evt, err := subjects.Event(res.RunnerID, "hello")
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Publish(evt, nil); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil || nc.LastError() != nil {
				t.Fatalf("the Runner's own event subject: %v, %v", err, nc.LastError())
			}
		})
	}
}

// migrateSchema makes the schema as the rendered manifests do: the migrate
// Job (--migrate-job), with its own environment, on the Server pod's
// stand-in volumes (the Job mounts the Server's claim).
func migrateSchema(t *testing.T, p deploy.Params, files podFiles, natsURL string, secrets map[string]string) {
	t.Helper()
	m := migrateJobContainer(t, p)
	env := containerEnv(t, files, m, natsURL, secrets)
	var out, errOut bytes.Buffer
	if code := cli.Run(t.Context(), commands.Server, m.Args, func(k string) string { return env[k] }, &out, &errOut); code != 0 {
		t.Fatalf("compass-server %v exited %d: %s", m.Args, code, errOut.String())
	}
}
