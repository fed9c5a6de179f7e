// Package natsdeploy holds the nats-server configurations for
// compass-callout; its test loads each with nats-server's own parser, runs it
// in-process and connects a Runner through the callout, so they stay valid.
package natsdeploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

const waitFor = 10 * time.Second

func start(t *testing.T, path string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server refuses %s: %v", filepath.Base(path), err)
	}
	opts.Port = server.RANDOM_PORT
	opts.NoLog, opts.NoSigs = true, true
	return natsembed.ServeOptions(t, opts)
}

// runnerConnects starts a responder on conn with cfg and checks a Runner with
// a projected token connects as its Runner ID, and a bad token does not.
func runnerConnects(t *testing.T, s *server.Server, cfg callout.Config, calloutOpts ...nats.Option) {
	t.Helper()
	is, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer is.Close()
	cfg.Resolver = verifiertest.Resolver(t, is, "prod", "")
	r, err := callout.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL(), calloutOpts...)
	if err != nil {
		t.Fatalf("callout user connect: %v", err)
	}
	natsembed.StartResponder(t, r, nc)

	tok, err := is.Token(kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := nats.Connect(s.ClientURL(), nats.Token(tok))
	if err != nil {
		t.Fatalf("runner connect: %v", err)
	}
	defer rc.Close()
	cid, _ := rc.GetClientID()
	cz, err := s.Connz(&server.ConnzOptions{CID: cid, Username: true})
	if err != nil || len(cz.Conns) != 1 {
		t.Fatalf("connz: %v", err)
	}
	if got := cz.Conns[0].AuthorizedUser; got != "prod/ip-10-0-1-5_ec2_internal" {
		t.Fatalf("runner user %q", got)
	}
	if _, err := nats.Connect(s.ClientURL(), nats.Token("nope")); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("bad token: %v", err)
	}
}

func TestServerConfigModeConfig(t *testing.T) {
	issuer, _ := nkeys.CreateAccount()
	sig := natsembed.SignerOf(t, issuer)
	x := natsembed.XKey(t)
	t.Setenv("COMPASS_CALLOUT_ISSUER", sig.Public())
	t.Setenv("COMPASS_CALLOUT_XKEY", x.Public())
	t.Setenv("COMPASS_CALLOUT_NATS_PASSWORD", "callout-pw")
	t.Setenv("COMPASS_SERVER_NATS_PASSWORD", "server-pw")
	t.Setenv("COMPASS_KICK_NATS_PASSWORD", "kick-pw")
	s := start(t, "server-config.conf")
	if got := s.ClientURL(); got == "" {
		t.Fatal("no client URL")
	}
	runnerConnects(t, s, callout.Config{Mode: callout.ModeServerConfig, ResponseSigner: sig, Account: "RUNNERS", XKey: x},
		nats.UserInfo("compass-callout", "callout-pw"))

	// The Compass Server's user skips the callout.
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("compass-server", "server-pw"))
	if err != nil {
		t.Fatalf("compass-server connect: %v", err)
	}
	nc.Close()

	// So does compass-callout's kick identity, which may list connections
	// and nothing else.
	kickMayListOnly(t, s, nats.UserInfo("compass-kick", "kick-pw"))
}

// kickMayListOnly connects a kick identity with opts and checks it is in
// the system account, gets an answer to $SYS.REQ.SERVER.PING.CONNZ, and is
// refused $SYS.REQ.SERVER.PING.STATSZ.
func kickMayListOnly(t *testing.T, s *server.Server, opts ...nats.Option) {
	t.Helper()
	refused := make(chan error, 4)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { refused <- err }))
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatalf("kick identity connect: %v", err)
	}
	defer nc.Close()
	m, err := nc.Request(kick.SubjectConnzAll, []byte(`{"acc":"RUNNERS","auth":true}`), waitFor)
	if err != nil {
		t.Fatalf("kick identity's %s: %v", kick.SubjectConnzAll, err)
	}
	var answer struct {
		Server struct{ ID string }           `json:"server"`
		Error  *struct{ Description string } `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &answer); err != nil || answer.Error != nil || answer.Server.ID != s.ID() {
		t.Fatalf("kick identity's listing answered %s (%v)", m.Data, err)
	}
	const statsz = "$SYS.REQ.SERVER.PING.STATSZ"
	if err := nc.PublishRequest(statsz, nc.NewRespInbox(), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-refused:
		if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), statsz) {
			t.Fatalf("kick identity's %s: %v, want a permissions violation", statsz, err)
		}
	case <-time.After(waitFor):
		t.Fatalf("kick identity's %s was not refused", statsz)
	}
}

// TestOperatorModeConfig writes resolver.conf as `nsc generate config
// --mem-resolver` does, next to a copy of operator.conf.
func TestOperatorModeConfig(t *testing.T) {
	dir := t.TempDir()
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "compass"
	ojwt, _ := oc.Encode(okp)
	account := func(name string, edit func(*jwt.AccountClaims)) (nkeys.KeyPair, string, string) {
		kp, _ := nkeys.CreateAccount()
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		ac.Name = name
		if edit != nil {
			edit(ac)
		}
		j, err := ac.Encode(okp)
		if err != nil {
			t.Fatal(err)
		}
		return kp, pub, j
	}
	sysSK, _ := nkeys.CreateAccount()
	sysSKPub, _ := sysSK.PublicKey()
	_, sysPub, sysJWT := account("SYS", func(ac *jwt.AccountClaims) { ac.SigningKeys.Add(sysSKPub) })
	runnersSK, _ := nkeys.CreateAccount()
	runnersSKPub, _ := runnersSK.PublicKey()
	_, runnersPub, runnersJWT := account("RUNNERS", func(ac *jwt.AccountClaims) { ac.SigningKeys.Add(runnersSKPub) })
	calloutUser, cuPub := natsembed.NewKey(t, nkeys.CreateUser)
	x := natsembed.XKey(t)
	authKP, authPub, authJWT := account("AUTH", func(ac *jwt.AccountClaims) {
		ac.EnableExternalAuthorization(cuPub)
		ac.Authorization.AllowedAccounts.Add(runnersPub)
		ac.Authorization.XKey = x.Public()
	})
	resolver := fmt.Sprintf("operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %s\n  %s: %s\n  %s: %s\n}\n",
		ojwt, sysPub, sysPub, sysJWT, runnersPub, runnersJWT, authPub, authJWT)
	if err := os.WriteFile(filepath.Join(dir, "resolver.conf"), []byte(resolver), 0o600); err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile("operator.conf")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "operator.conf"), conf, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COMPASS_NATS_SENTINEL_JWT", natsembed.Sentinel(t, authKP))
	s := start(t, filepath.Join(dir, "operator.conf"))

	credsPath := natsembed.CredsFile(t, filepath.Join(dir, "callout.creds"), calloutUser, authKP, nil)
	runnerConnects(t, s, callout.Config{
		Mode: callout.ModeOperator, ResponseSigner: natsembed.SignerOf(t, authKP),
		UserSigner: natsembed.SignerOf(t, runnersSK), Account: runnersPub, XKey: x,
	}, nats.UserCredentials(credsPath))

	// The kick identity: a user JWT of SYS, signed by SYS's signing key as
	// nsc signs it, with the permissions deploy/nats/README.md gives it, and
	// nothing in operator.conf.
	kickUser, _ := natsembed.NewKey(t, nkeys.CreateUser)
	kickCredsPath := natsembed.CredsFile(t, filepath.Join(dir, "compass-kick.creds"), kickUser, sysSK, func(kc *jwt.UserClaims) {
		kc.Name = "compass-kick"
		kc.IssuerAccount = sysPub
		kc.Permissions.Pub.Allow.Add(kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick)
		kc.Permissions.Sub.Allow.Add("_INBOX.>")
	})
	kickMayListOnly(t, s, nats.UserCredentials(kickCredsPath))
}
