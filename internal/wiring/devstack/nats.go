package devstack

// The dev stack's embedded nats-server (auth callout, server-config mode,
// xkey on) and its in-process callout and kicker.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/server"
)

// NATS users of the dev server: the callout and the Server are the
// auth_callout's auth_users (they bypass the callout); everyone else goes
// through it.
const (
	devCalloutUser = "callout"
	devServerUser  = "compass-server"
	devKickUser    = "compass-kick" // the kick identity: CONNZ and KICK in SYS, nothing else
	devAccount     = "RUNNERS"      // the account Runners (and the Server) are in
)

type devNATSCreds struct {
	server, callout, kick string
	issuer                *callout.Signer
	xkey                  *callout.XKey
}

func startDevNATS(listen string) (*natsserver.Server, devNATSCreds, error) {
	var c devNATSCreds
	l, err := natsListen(listen)
	if err != nil {
		return nil, c, err
	}
	if c.server, err = randomSecret(); err != nil {
		return nil, c, err
	}
	if c.callout, err = randomSecret(); err != nil {
		return nil, c, err
	}
	if c.kick, err = randomSecret(); err != nil {
		return nil, c, err
	}
	if c.issuer, err = callout.GenerateSigner(nkeys.PrefixByteAccount); err != nil {
		return nil, c, fmt.Errorf("server: dev: %w", err)
	}
	if c.xkey, err = callout.GenerateXKey(); err != nil {
		return nil, c, fmt.Errorf("server: dev: %w", err)
	}
	conf := fmt.Sprintf(`
listen: %q
server_name: compass-dev
accounts {
  CALLOUT { users: [ { user: %q, password: %q } ] }
  %s { users: [ { user: %q, password: %q } ] }
  SYS { users: [ { user: %q, password: %q, permissions: { publish: { allow: [ %q, %q, %q ] }, subscribe: { allow: [ "_INBOX.>" ] } } } ] }
}
system_account: SYS
authorization {
  auth_callout {
    issuer: %q
    account: CALLOUT
    auth_users: [ %q, %q, %q ]
    xkey: %q
  }
}
`, l, devCalloutUser, c.callout, devAccount, devServerUser, c.server,
		devKickUser, c.kick, kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick,
		c.issuer.Public(), devCalloutUser, devServerUser, devKickUser, c.xkey.Public())
	opts := &natsserver.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		return nil, c, fmt.Errorf("server: dev: nats config: %w", err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		return nil, c, fmt.Errorf("server: dev: nats-server: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(natsReady) {
		ns.Shutdown()
		return nil, c, fmt.Errorf("server: dev: nats-server did not start listening on %s within %s", listen, natsReady)
	}
	return ns, c, nil
}

// startDevCallout runs the callout and its kicker (a revoked or duplicated
// Runner loses its live connection, as with compass-callout) until ctx ends;
// the kicker's goroutines end with ctx, and wg waits for them.
func startDevCallout(ctx context.Context, url string, c devNATSCreds, si server.ServeInfo, log *slog.Logger, wg *sync.WaitGroup) (*callout.Responder, error) {
	var kp atomic.Pointer[kick.Kicker]
	r, err := callout.New(callout.Config{
		Mode:           callout.ModeServerConfig,
		Resolver:       si.Resolver,
		ResponseSigner: c.issuer,
		Account:        devAccount,
		XKey:           c.xkey,
		Logger:         log,
		Observe: func(ev callout.Event) {
			if k := kp.Load(); k != nil && ev.Outcome == callout.OutcomeAuthorized {
				k.Authorized(callout.GrantOf(ev))
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("dev: %w", err)
	}
	kc, err := nats.Connect(url, nats.Name("compass-callout-kick"), nats.UserInfo(devKickUser, c.kick), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("dev: kick identity connect: %w", err)
	}
	account, issuer := r.RunnerAccount()
	k, err := kick.New(kick.Config{Conn: kc, Account: account, Issuers: []string{issuer},
		Policy: callout.RevocationPolicy(si.Verifier, si.Store, nil), Logger: log})
	if err != nil {
		kc.Close()
		return nil, fmt.Errorf("dev: %w", err)
	}
	kp.Store(k)
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer kc.Close()
		k.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		callout.WatchRevocations(ctx, si.Store, callout.DefaultRevocationPoll, k, nil, log)
	}()
	nc, err := nats.Connect(url, nats.Name("compass-callout"), nats.UserInfo(devCalloutUser, c.callout), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("dev: callout connect: %w", err)
	}
	if err := r.Start(ctx, nc); err != nil {
		nc.Close()
		return nil, fmt.Errorf("dev: %w", err)
	}
	go func() {
		<-r.Done()
		nc.Close()
	}()
	return r, nil
}
