package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/deploytest"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// operatorValues are the chart values of operator mode for recipe r with
// the callout keys keys (docs/self-host.md, "Operator mode through the
// chart").
func operatorValues(t *testing.T, r *natsembed.Recipe, keys natsembed.CalloutKeys) map[string]any {
	t.Helper()
	return map[string]any{
		"callout": map[string]any{"mode": "operator", "account": r.RunnersPub, "calloutAccount": r.AuthPub},
		"nats":    map[string]any{"operator": map[string]any{"resolver": r.Resolver(t, keys.XKey, keys), "sentinel": r.Sentinel()}},
	}
}

// renderedNATSConfig is nats.conf of ConfigMap compass-nats-config in the
// chart rendered with p and extra.
func renderedNATSConfig(t *testing.T, p deploy.Params, extra map[string]any) []byte {
	t.Helper()
	out, err := deploy.RenderValues(p, extra)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := deploytest.Documents(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(doc, &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Kind == "ConfigMap" && cm.Name == "compass-nats-config" {
			return []byte(cm.Data["nats.conf"])
		}
	}
	t.Fatal("no ConfigMap compass-nats-config rendered")
	return nil
}

// Operator mode through the chart, run: the chart rendered with callout.mode
// operator and the recipe's JWTs and users (deploy/nats/README.md's layout,
// natsembed.Recipe), its nats.conf loaded by nats-server's own parser and
// served, and compass-server and compass-callout (in the Server's pod, on
// SQLite) run with the rendered containers' environment, each Secret key a
// file where the pod mounts it. A minted Runner token enrolls at the door
// and connects to NATS through the callout as its Runner ID; the Server
// connects with its own user JWT (signed by the RUNNERS key the callout
// does not hold); the kicker's sweeps, one every 100 ms, judge the Runner
// and leave the Server's connection alone (DL-458).
func TestRenderedOperatorModeRuns(t *testing.T) {
	r := natsembed.NewRecipe(t)
	keys := natsembed.NewCalloutKeys(t)
	certDir := t.TempDir()
	certFile, keyFile, caFile := servertest.TLS(t, certDir)
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}

	p := deploy.DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	p.NATSImage = "nats:2.15.2-alpine"
	p.CABundle = string(caPEM)
	values := operatorValues(t, r, keys)

	// nats-server as rendered, its certificate where the pod mounts it.
	conf := string(renderedNATSConfig(t, p, values))
	for _, f := range []struct{ mount, file string }{{"/etc/nats/tls/tls.crt", certFile}, {"/etc/nats/tls/tls.key", keyFile}} {
		if strings.Count(conf, `"`+f.mount+`"`) != 1 {
			t.Fatalf("the rendered configuration does not read %s once:\n%s", f.mount, conf)
		}
		conf = strings.ReplaceAll(conf, `"`+f.mount+`"`, fmt.Sprintf("%q", f.file))
	}
	path := filepath.Join(t.TempDir(), "nats.conf")
	writeSecretFile(t, path, conf)
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered operator-mode configuration: %v", err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
	opts.NoLog, opts.NoSigs = true, true
	ns := natsembed.ServeOptions(t, opts)
	natsURL := ns.ClientURL() // tls://: the rendered configuration requires TLS

	// The Server's pod: the Server and the callout, on SQLite.
	spec := deploytest.RenderedPodValues(t, p, values, "StatefulSet", deploy.ServerName)
	files := podFiles{t, t.TempDir(), deploy.ServerName}
	srv, co := container(t, spec, "server"), container(t, spec, "callout")
	senv := containerEnv(t, files, srv, natsURL, nil)
	cenv := containerEnv(t, files, co, natsURL, nil)
	xkeySeed, issuerSeed, userSeed := keys.Seeds(t)
	for path, data := range map[string][]byte{
		senv["COMPASS_NATS_CREDS"]:             r.ServerCreds(),
		cenv["COMPASS_NATS_CREDS"]:             r.CalloutCreds(),
		cenv["COMPASS_KICK_CREDS"]:             r.KickCreds(),
		cenv["COMPASS_XKEY_SEED_FILE"]:         xkeySeed,
		cenv["COMPASS_ISSUER_SEED_FILE"]:       issuerSeed,
		cenv["COMPASS_USER_SIGNING_SEED_FILE"]: userSeed,
		senv["COMPASS_NATS_CA_FILE"]:           caPEM,
		cenv["COMPASS_NATS_CA_FILE"]:           caPEM,
	} {
		if path == "" {
			t.Fatalf("the rendered operator-mode pod does not read every credential (server env %v, callout env %v)", senv, cenv)
		}
		writeSecretFile(t, path, string(data))
	}
	for k, f := range map[string]string{"COMPASS_TLS_CERT": certFile, "COMPASS_TLS_KEY": keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		writeSecretFile(t, senv[k], string(b))
	}
	clusters := "clusters:\n" + verifiertest.ClusterEntry(t, testkeys.Issuer(t), t.TempDir(), "prod")
	writeSecretFile(t, senv["COMPASS_RUNNER_CLUSTERS"], clusters)
	writeSecretFile(t, cenv["COMPASS_RUNNER_CLUSTERS"], clusters)
	for name, want := range map[string]string{"COMPASS_MODE": "operator", "COMPASS_ACCOUNT": r.RunnersPub, "COMPASS_CALLOUT_ACCOUNT": r.AuthPub} {
		if cenv[name] != want {
			t.Fatalf("the callout's %s = %q, want %q", name, cenv[name], want)
		}
	}
	for _, name := range []string{"COMPASS_NATS_PASSWORD_FILE", "COMPASS_KICK_PASSWORD_FILE", "COMPASS_NATS_USER", "COMPASS_KICK_USER"} {
		if v, ok := cenv[name]; ok {
			t.Fatalf("the operator-mode callout has server-config mode's %s=%q", name, v)
		}
	}
	// A sweep every 100 ms, so that the kicker judges every connection
	// many times within the test.
	cenv["COMPASS_SWEEP_INTERVAL"] = "100ms"
	migrateSchema(t, p, files, natsURL, nil)

	ctx, cancel := context.WithCancel(t.Context())
	var serverLog, calloutLog testlog.Buffer
	serverDone := runProgram(ctx, commands.Server, srv.Args, senv, io.Discard, &serverLog)
	calloutDone := runProgram(ctx, commands.Callout, co.Args, cenv, io.Discard, &calloutLog)
	defer func() {
		if t.Failed() {
			t.Logf("server log:\n%s\ncallout log:\n%s", serverLog.String(), calloutLog.String())
		}
		cancel()
		for name, done := range map[string]<-chan int{"serve": serverDone, "compass-callout": calloutDone} {
			if code := <-done; code != 0 {
				t.Errorf("%s exited %d", name, code)
			}
		}
	}()
	scrape := func(addr, family string) string {
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, family) {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n")
	}
	testutil.Eventually(t, topologyWait, "the callout ready and the Server connected to NATS", func() bool {
		res, err := http.Get("http://" + cenv["COMPASS_METRICS_ADDR"] + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK && scrape(senv["COMPASS_METRICS_ADDR"], "compass_server_nats_connected") == "compass_server_nats_connected 1"
	})

	var out, errOut bytes.Buffer
	if code := cli.Run(t.Context(), commands.Server, []string{"mint-runner-token", "--runner-id", "build-01"},
		func(k string) string { return senv[k] }, &out, &errOut); code != 0 {
		t.Fatalf("mint-runner-token exited %d: %s", code, errOut.String())
	}
	token := strings.TrimSpace(out.String())
	inbox, _ := subjects.InboxPrefix("build-01")
	nc, err := nats.Connect(natsURL, nats.Token(token), nats.CustomInboxPrefix(inbox), nats.RootCAs(caFile), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("a Runner's CONNECT through the operator-mode callout: %v\ncallout log:\n%s", err, calloutLog.String())
	}
	defer nc.Close()
	evt, _ := subjects.Event("build-01", "hello")
	if err := nc.Publish(evt, nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil || nc.LastError() != nil {
		t.Fatalf("the Runner's own event subject: %v, %v", err, nc.LastError())
	}

	// Ten sweeps with the Runner and the Server connected: none ends
	// either.
	sweeps := func() int {
		var n int
		for _, l := range strings.Split(scrape(cenv["COMPASS_METRICS_ADDR"], `compass_callout_kick_sweeps_total{result="ok"}`), "\n") {
			_, _ = fmt.Sscanf(strings.TrimPrefix(l, `compass_callout_kick_sweeps_total{result="ok"} `), "%d", &n)
		}
		return n
	}
	first := sweeps()
	testutil.Eventually(t, topologyWait, "ten more sweeps of the kicker", func() bool { return sweeps() >= first+10 })
	kicks := scrape(cenv["COMPASS_METRICS_ADDR"], "compass_callout_kicks_total{")
	if kicks == "" {
		t.Fatal("the callout exports no compass_callout_kicks_total")
	}
	for _, l := range strings.Split(kicks, "\n") {
		if !strings.HasSuffix(l, "} 0") {
			t.Fatalf("the kicker ended a connection in operator mode: %s\ncallout log:\n%s", l, calloutLog.String())
		}
	}
	if got := scrape(senv["COMPASS_METRICS_ADDR"], "compass_server_nats_connected"); got != "compass_server_nats_connected 1" {
		t.Fatalf("the Server's NATS connection after the sweeps: %q\nserver log:\n%s", got, serverLog.String())
	}
	if !nc.IsConnected() {
		t.Fatal("the Runner's NATS connection ended during the sweeps")
	}
}

// A values file half in one mode and half in the other is refused at the
// rendering, naming the value, rather than rendered into a nats-server
// configuration or a callout that locks every Runner out at the next
// restart. Each case changes one value of a valid operator-mode (or
// server-config) file.
func TestTheChartRefusesAHalfSwitchedMode(t *testing.T) {
	r := natsembed.NewRecipe(t)
	keys := natsembed.NewCalloutKeys(t)
	resolver := r.Resolver(t, keys.XKey, keys)
	issuer, _ := natsembed.NewKey(t, nkeys.CreateAccount)
	operator := func(callout, nats map[string]any) map[string]any {
		c := map[string]any{"mode": "operator", "calloutAccount": r.AuthPub}
		n := map[string]any{"resolver": resolver, "sentinel": r.Sentinel()}
		maps.Copy(c, callout)
		maps.Copy(n, nats)
		return map[string]any{"callout": c, "nats": map[string]any{"operator": n}}
	}
	for _, tc := range []struct {
		name    string
		account string // --nats-account
		values  map[string]any
		want    string // "": renders
	}{
		{"operator mode", r.RunnersPub, operator(nil, nil), ""},
		{"operator mode, step 2 of a rotation", r.RunnersPub, operator(map[string]any{"nextXKey": true, "nextIssuer": true, "nextUserSigning": true}, nil), ""},
		{"server-config mode", "RUNNERS", nil, ""},
		{"operator mode with the account's name", "RUNNERS", operator(nil, nil),
			`callout.account: "RUNNERS" in operator mode: give the RUNNERS account's public key`},
		{"operator mode without the callout account", r.RunnersPub, operator(map[string]any{"calloutAccount": ""}, nil),
			"callout.calloutAccount: required in operator mode"},
		{"operator mode, the callout account a user key", r.RunnersPub, operator(map[string]any{"calloutAccount": r.CalloutUserPub}, nil),
			"values.schema.json: at /callout/calloutAccount: '" + r.CalloutUserPub + "' does not match"},
		{"operator mode, one account for both", r.RunnersPub, operator(map[string]any{"calloutAccount": r.RunnersPub}, nil),
			"callout.calloutAccount: is also callout.account"},
		{"operator mode without the resolver", r.RunnersPub, operator(nil, map[string]any{"resolver": ""}),
			"nats.operator.resolver: required in operator mode"},
		{"operator mode, the resolver without its preload", r.RunnersPub, operator(nil, map[string]any{"resolver": resolver[:strings.Index(resolver, "resolver_preload")]}),
			"nats.operator.resolver: has no resolver_preload"},
		{"operator mode, the resolver without the operator", r.RunnersPub, operator(nil, map[string]any{"resolver": resolver[strings.Index(resolver, "# System"):]}),
			"nats.operator.resolver: has no operator"},
		{"operator mode without the sentinel", r.RunnersPub, operator(nil, map[string]any{"sentinel": ""}),
			"nats.operator.sentinel: required in operator mode"},
		{"operator mode, the sentinel not a JWT", r.RunnersPub, operator(nil, map[string]any{"sentinel": "sentinel"}),
			"values.schema.json: at /nats/operator/sentinel: 'sentinel' does not match"},
		{"operator mode with server-config mode's issuer", r.RunnersPub, operator(map[string]any{"issuer": natsembed.PubOf(t, issuer)}, nil),
			"callout.issuer: set in operator mode"},
		{"operator mode, a next signing key without a next xkey", r.RunnersPub, operator(map[string]any{"nextIssuer": true}, nil),
			"callout.nextIssuer: true without callout.nextXKey"},
		{"operator mode, a next user-signing key without a next xkey", r.RunnersPub, operator(map[string]any{"nextUserSigning": true}, nil),
			"callout.nextUserSigning: true without callout.nextXKey"},
		{"server-config mode with the resolver", "RUNNERS", map[string]any{"nats": map[string]any{"operator": map[string]any{"resolver": resolver}}},
			"nats.operator: set in server-config mode"},
		{"server-config mode with a next user-signing key", "RUNNERS", map[string]any{"callout": map[string]any{"nextXKey": true, "nextUserSigning": true}},
			"callout.nextUserSigning: true in server-config mode"},
		{"a mode misspelt", "RUNNERS", map[string]any{"callout": map[string]any{"mode": "operater"}},
			"values.schema.json: at /callout/mode: value must be one of 'server-config', 'operator'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := deploy.DefaultParams()
			p.NATSAccount = tc.account
			_, err := deploy.RenderValues(p, tc.values)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("rendered; want refused with %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("refused with %v; want %q", err, tc.want)
			}
		})
	}
}

// Step 2 of an operator-mode rotation is values too (docs/self-host.md,
// "Rotating the callout's keys"): with callout.nextUserSigning the callout
// gets key next-seed of Secret compass-callout-user-signing beside seed and
// reads it as --next-user-signing-seed-file; without it, neither.
func TestRender_CalloutNextUserSigningByValues(t *testing.T) {
	r := natsembed.NewRecipe(t)
	keys := natsembed.NewCalloutKeys(t)
	for _, next := range []bool{false, true} {
		t.Run(fmt.Sprintf("nextUserSigning=%v", next), func(t *testing.T) {
			p := deploy.DefaultParams()
			p.NATSAccount = r.RunnersPub
			values := operatorValues(t, r, keys)
			if next {
				maps.Copy(values["callout"].(map[string]any), map[string]any{"nextXKey": true, "nextUserSigning": true})
			}
			spec := deploytest.RenderedPodValues(t, p, values, "Deployment", "compass-callout")
			c := container(t, spec, "callout")
			env := plainEnv(c)
			fs, err := cli.Parse(commands.Callout, commands.Callout, nil, func(k string) string { return env[k] })
			if err != nil {
				t.Fatalf("compass-callout with the rendered environment: %v", err)
			}
			cur := projectedFile(spec, c, "compass-callout-user-signing", "seed")
			if cur == "" || fs.Lookup("user-signing-seed-file").Value.String() != cur {
				t.Fatalf("seed of compass-callout-user-signing at %q, --user-signing-seed-file=%q: want the same file", cur, fs.Lookup("user-signing-seed-file").Value)
			}
			file := projectedFile(spec, c, "compass-callout-user-signing", "next-seed")
			got := fs.Lookup("next-user-signing-seed-file").Value.String()
			if !next {
				if file != "" || got != "" {
					t.Fatalf("nextUserSigning unset, yet next-seed at %q, --next-user-signing-seed-file=%q", file, got)
				}
				return
			}
			if file == "" || got != file || file == cur {
				t.Fatalf("next-seed projected at %q, --next-user-signing-seed-file=%q (seed at %q): want the flag at the next seed's own file", file, got, cur)
			}
		})
	}
}
