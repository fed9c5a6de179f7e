package deploy_test

import (
	"bytes"
	"context"
	"errors"
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

// operatorPod is the chart's Server pod (the Server on SQLite, the callout
// beside it) in operator mode, run: the chart rendered with the recipe's
// values, its nats.conf loaded by nats-server's own parser and served
// in-process, compass-server and compass-callout run with the rendered
// containers' environment, each Secret key a file where the pod mounts it.
type operatorPod struct {
	ns                    *server.Server
	confPath, natsURL     string
	caFile                string
	certFile, keyFile     string
	senv, cenv            map[string]string
	serverLog, calloutLog *testlog.Buffer
	// ports are the client and monitoring ports nats.conf is moved to: in
	// the file, so that a reload of it keeps them.
	ports []int
}

// startOperatorPod renders and runs the pod with the callout's keys cur
// and, when next is set, the next ones (callout.nextXKey, nextIssuer and
// nextUserSigning: step 2 of a rotation); nats-server runs cur's account
// JWTs. The kicker sweeps every 100 ms.
func startOperatorPod(t *testing.T, r *natsembed.Recipe, cur natsembed.CalloutKeys, next *natsembed.CalloutKeys) *operatorPod {
	t.Helper()
	o := &operatorPod{serverLog: &testlog.Buffer{}, calloutLog: &testlog.Buffer{}, ports: testutil.FreePorts(t, 2)}
	o.certFile, o.keyFile, o.caFile = servertest.TLS(t, t.TempDir())
	caPEM, err := os.ReadFile(o.caFile)
	if err != nil {
		t.Fatal(err)
	}
	p := deploy.DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	p.NATSImage = "nats:2.15.2-alpine"
	p.CABundle = string(caPEM)
	values := operatorValues(t, r, cur)
	if next != nil {
		maps.Copy(values["callout"].(map[string]any), map[string]any{"nextXKey": true, "nextIssuer": true, "nextUserSigning": true})
	}

	// nats-server as rendered, its certificate where the pod mounts it.
	o.confPath = filepath.Join(t.TempDir(), "nats.conf")
	o.writeConf(t, renderedNATSConfig(t, p, values))
	opts, err := server.ProcessConfigFile(o.confPath)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered operator-mode configuration: %v", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	o.ns = natsembed.ServeOptions(t, opts)
	o.natsURL = o.ns.ClientURL() // tls://: the rendered configuration requires TLS

	spec := deploytest.RenderedPodValues(t, p, values, "StatefulSet", deploy.ServerName)
	files := podFiles{t, t.TempDir(), deploy.ServerName}
	srv, co := container(t, spec, "server"), container(t, spec, "callout")
	o.senv = containerEnv(t, files, srv, o.natsURL, nil)
	o.cenv = containerEnv(t, files, co, o.natsURL, nil)
	xkeySeed, issuerSeed, userSeed := cur.Seeds(t)
	secrets := map[string][]byte{
		o.senv["COMPASS_NATS_CREDS"]:             r.ServerCreds(),
		o.cenv["COMPASS_NATS_CREDS"]:             r.CalloutCreds(),
		o.cenv["COMPASS_KICK_CREDS"]:             r.KickCreds(),
		o.cenv["COMPASS_XKEY_SEED_FILE"]:         xkeySeed,
		o.cenv["COMPASS_ISSUER_SEED_FILE"]:       issuerSeed,
		o.cenv["COMPASS_USER_SIGNING_SEED_FILE"]: userSeed,
		o.senv["COMPASS_NATS_CA_FILE"]:           caPEM,
		o.cenv["COMPASS_NATS_CA_FILE"]:           caPEM,
	}
	if next != nil {
		nx, ni, nu := next.Seeds(t)
		maps.Copy(secrets, map[string][]byte{
			o.cenv["COMPASS_NEXT_XKEY_SEED_FILE"]:         nx,
			o.cenv["COMPASS_NEXT_ISSUER_SEED_FILE"]:       ni,
			o.cenv["COMPASS_NEXT_USER_SIGNING_SEED_FILE"]: nu,
		})
	}
	for path, data := range secrets {
		if path == "" {
			t.Fatalf("the rendered operator-mode pod does not read every credential (server env %v, callout env %v)", o.senv, o.cenv)
		}
		writeSecretFile(t, path, string(data))
	}
	for k, f := range map[string]string{"COMPASS_TLS_CERT": o.certFile, "COMPASS_TLS_KEY": o.keyFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		writeSecretFile(t, o.senv[k], string(b))
	}
	clusters := "clusters:\n" + verifiertest.ClusterEntry(t, testkeys.Issuer(t), t.TempDir(), "prod")
	writeSecretFile(t, o.senv["COMPASS_RUNNER_CLUSTERS"], clusters)
	writeSecretFile(t, o.cenv["COMPASS_RUNNER_CLUSTERS"], clusters)
	for name, want := range map[string]string{"COMPASS_MODE": "operator", "COMPASS_ACCOUNT": r.RunnersPub, "COMPASS_CALLOUT_ACCOUNT": r.AuthPub} {
		if o.cenv[name] != want {
			t.Fatalf("the callout's %s = %q, want %q", name, o.cenv[name], want)
		}
	}
	for _, name := range []string{"COMPASS_NATS_PASSWORD_FILE", "COMPASS_KICK_PASSWORD_FILE", "COMPASS_NATS_USER", "COMPASS_KICK_USER"} {
		if v, ok := o.cenv[name]; ok {
			t.Fatalf("the operator-mode callout has server-config mode's %s=%q", name, v)
		}
	}
	// A sweep every 100 ms, so that the kicker judges every connection
	// many times within a test.
	o.cenv["COMPASS_SWEEP_INTERVAL"] = "100ms"
	migrateSchema(t, p, files, o.natsURL, nil)

	ctx, cancel := context.WithCancel(t.Context())
	serverDone := runProgram(ctx, commands.Server, srv.Args, o.senv, io.Discard, o.serverLog)
	calloutDone := runProgram(ctx, commands.Callout, co.Args, o.cenv, io.Discard, o.calloutLog)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s\ncallout log:\n%s", o.serverLog.String(), o.calloutLog.String())
		}
		cancel()
		for name, done := range map[string]<-chan int{"serve": serverDone, "compass-callout": calloutDone} {
			if code := <-done; code != 0 {
				t.Errorf("%s exited %d", name, code)
			}
		}
	})
	testutil.Eventually(t, topologyWait, "the callout ready and the Server connected to NATS", func() bool {
		res, err := http.Get("http://" + o.cenv["COMPASS_METRICS_ADDR"] + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK && o.scrape(o.senv, "compass_server_nats_connected") == "compass_server_nats_connected 1"
	})
	return o
}

// writeConf writes the rendered nats.conf conf where the server reads it,
// its certificate paths moved to the test's.
func (o *operatorPod) writeConf(t *testing.T, conf []byte) {
	t.Helper()
	c := string(conf)
	for _, f := range []struct{ mount, file string }{{"/etc/nats/tls/tls.crt", o.certFile}, {"/etc/nats/tls/tls.key", o.keyFile}} {
		if strings.Count(c, `"`+f.mount+`"`) != 1 {
			t.Fatalf("the rendered configuration does not read %s once", f.mount)
		}
		c = strings.ReplaceAll(c, `"`+f.mount+`"`, fmt.Sprintf("%q", f.file))
	}
	for _, m := range []struct{ line, loopback string }{
		{"port: 4222\n", fmt.Sprintf("listen: \"127.0.0.1:%d\"\n", o.ports[0])},
		{"http: \"127.0.0.1:8222\"\n", fmt.Sprintf("http: \"127.0.0.1:%d\"\n", o.ports[1])},
	} {
		if strings.Count(c, m.line) != 1 {
			t.Fatalf("the rendered configuration has no %q", m.line)
		}
		c = strings.Replace(c, m.line, m.loopback, 1)
	}
	writeSecretFile(t, o.confPath, c)
}

// scrape is the lines of family in the /metrics of the daemon whose
// environment is env.
func (o *operatorPod) scrape(env map[string]string, family string) string {
	res, err := http.Get("http://" + env["COMPASS_METRICS_ADDR"] + "/metrics")
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

// mint is mint-runner-token in the Server's container (kubectl exec).
func (o *operatorPod) mint(t *testing.T, runnerID string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := cli.Run(t.Context(), commands.Server, []string{"mint-runner-token", "--runner-id", runnerID},
		func(k string) string { return o.senv[k] }, &out, &errOut); code != 0 {
		t.Fatalf("mint-runner-token exited %d: %s", code, errOut.String())
	}
	return strings.TrimSpace(out.String())
}

// connect connects a Runner with token as runnerID, its own event subject
// published to.
func (o *operatorPod) connect(t *testing.T, runnerID, token string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	inbox, _ := subjects.InboxPrefix(runnerID)
	nc, err := nats.Connect(o.natsURL, append([]nats.Option{nats.Token(token), nats.CustomInboxPrefix(inbox), nats.RootCAs(o.caFile), nats.Timeout(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatalf("a Runner's CONNECT through the operator-mode callout: %v", err)
	}
	t.Cleanup(nc.Close)
	evt, _ := subjects.Event(runnerID, "hello")
	if err := nc.Publish(evt, nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil || nc.LastError() != nil {
		t.Fatalf("the Runner's own event subject: %v, %v", err, nc.LastError())
	}
	return nc
}

// sweeps is compass_callout_kick_sweeps_total{result="ok"}.
func (o *operatorPod) sweeps() int {
	var n int
	_, _ = fmt.Sscanf(strings.TrimPrefix(o.scrape(o.cenv, `compass_callout_kick_sweeps_total{result="ok"}`), `compass_callout_kick_sweeps_total{result="ok"} `), "%d", &n)
	return n
}

// noKicks fails the test unless every compass_callout_kicks_total series
// is 0.
func (o *operatorPod) noKicks(t *testing.T) {
	t.Helper()
	kicks := o.scrape(o.cenv, "compass_callout_kicks_total{")
	if kicks == "" {
		t.Fatal("the callout exports no compass_callout_kicks_total")
	}
	for _, l := range strings.Split(kicks, "\n") {
		if !strings.HasSuffix(l, "} 0") {
			t.Fatalf("the kicker ended a connection in operator mode: %s", l)
		}
	}
}

// Operator mode through the chart, run (operatorPod): a minted Runner
// token connects to NATS through the callout as its Runner ID; the Server
// connects with its own user JWT (signed by the RUNNERS key the callout
// does not hold); ten sweeps of the kicker judge the Runner and leave the
// Server's connection alone (DL-458).
func TestRenderedOperatorModeRuns(t *testing.T) {
	r := natsembed.NewRecipe(t)
	o := startOperatorPod(t, r, natsembed.NewCalloutKeys(t), nil)
	nc := o.connect(t, "build-01", o.mint(t, "build-01"))

	first := o.sweeps()
	testutil.Eventually(t, topologyWait, "ten more sweeps of the kicker", func() bool { return o.sweeps() >= first+10 })
	o.noKicks(t)
	if got := o.scrape(o.senv, "compass_server_nats_connected"); got != "compass_server_nats_connected 1" {
		t.Fatalf("the Server's NATS connection after the sweeps: %q", got)
	}
	if !nc.IsConnected() {
		t.Fatal("the Runner's NATS connection ended during the sweeps")
	}
}

// Step 3 of an operator-mode rotation through the chart, as
// docs/self-host.md says it reaches a running nats-server: the new resolver
// (AUTH with the new xkey and signing key, RUNNERS with the new signing
// key, the old ones removed) rendered into nats.conf and reloaded, no
// restart. The callout holds both key sets (step 2). The Runner connected
// on the old keys is disconnected by the server (its user JWT's signer is
// gone) and reconnects at once with a JWT the new RUNNERS key signs, with
// no authorization error; a new Runner connects on the new keys; the
// Server's connection, signed by the kept key, is never dropped.
func TestRenderedOperatorModeTakesANewResolverOnReload(t *testing.T) {
	r := natsembed.NewRecipe(t)
	cur, next := natsembed.NewCalloutKeys(t), natsembed.NewCalloutKeys(t)
	o := startOperatorPod(t, r, cur, &next)
	authErrs := make(chan error, 16)
	reconnected := make(chan struct{}, 16)
	nc := o.connect(t, "build-01", o.mint(t, "build-01"),
		nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization") {
				authErrs <- err
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	// The answers by key: the xkey a request was sealed to says which
	// account JWTs its server runs, and so which RUNNERS signing key
	// signed the user JWT.
	curXKey, curIssuer, _ := cur.Pubs(t)
	nextXKey, nextIssuer, _ := next.Pubs(t)
	answers := func(key string) string { return o.scrape(o.cenv, `compass_callout_key_answers_total{key="`+key+`"`) }
	if !strings.HasSuffix(answers(curXKey), " 1") || !strings.HasSuffix(answers(nextXKey), " 0") {
		t.Fatalf("before the reload: answers sealed to the current xkey %q, to the next %q; want 1 and 0", answers(curXKey), answers(nextXKey))
	}

	p := deploy.DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	p.NATSImage = "nats:2.15.2-alpine"
	caPEM, err := os.ReadFile(o.caFile)
	if err != nil {
		t.Fatal(err)
	}
	p.CABundle = string(caPEM)
	values := operatorValues(t, r, next)
	maps.Copy(values["callout"].(map[string]any), map[string]any{"nextXKey": true, "nextIssuer": true, "nextUserSigning": true})
	o.writeConf(t, renderedNATSConfig(t, p, values))
	if err := o.ns.Reload(); err != nil {
		t.Fatalf("nats-server refuses to reload the new resolver: %v", err)
	}

	select {
	case <-reconnected:
	case <-time.After(topologyWait):
		t.Fatal("the Runner on the old keys was not disconnected and reconnected after the reload")
	}
	if !nc.IsConnected() {
		t.Fatal("the Runner is not connected after its reconnect")
	}
	testutil.Eventually(t, topologyWait, "the reconnect answered with the next keys", func() bool {
		return strings.HasSuffix(answers(nextXKey), " 1") && strings.HasSuffix(answers(nextIssuer), " 1")
	})
	o.connect(t, "build-02", o.mint(t, "build-02"))
	if !strings.HasSuffix(answers(nextXKey), " 2") || !strings.HasSuffix(answers(curIssuer), " 1") {
		t.Fatalf("after the reload: answers sealed to the next xkey %q, signed by the current issuer %q; want 2 and still 1", answers(nextXKey), answers(curIssuer))
	}
	select {
	case err := <-authErrs:
		t.Fatalf("the Runner saw an authorization error across the reload: %v", err)
	default:
	}
	o.noKicks(t)
	if got := o.scrape(o.senv, `compass_server_nats_connect_failures_total{cause="authorization_refused"`); !strings.HasSuffix(got, " 0") {
		t.Fatalf("the Server's refused connects: %q, want 0", got)
	}
	if got := o.scrape(o.senv, "compass_server_nats_connected"); got != "compass_server_nats_connected 1" {
		t.Fatalf("the Server's NATS connection after the reload: %q", got)
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
