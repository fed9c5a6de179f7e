package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
)

// The kick identity as the rendered configuration names it.
const (
	kickUser = "compass-kick"
)

// kickWait bounds one answer of the system account's API, and the wait for
// a permissions violation, on a loaded two-core machine.
const kickWait = 5 * time.Second

// userNamed returns the user name of opts, or fails the test.
func userNamed(t *testing.T, opts *server.Options, name string) *server.User {
	t.Helper()
	for _, u := range opts.Users {
		if u.Username == name {
			return u
		}
	}
	t.Fatalf("no user %s in the configuration", name)
	return nil
}

func permissionsJSON(t *testing.T, p *server.Permissions) string {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// In the rendered configuration, for one server and for every server of a
// cluster, compass-kick is the system account's only user, its password
// comes from COMPASS_KICK_NATS_PASSWORD, it skips the callout (auth_users),
// and it may publish exactly the three requests package kick makes and
// subscribe only to its reply inboxes and the Runners' account's connect
// and disconnect events: the permissions of
// natsembed.KickUserConfig, the user the kick and revocation tests run
// compass-callout with, and nothing more.
func TestNATSConfig_KickUserIsLeastPrivilege(t *testing.T) {
	var ref server.Options
	if err := ref.ProcessConfigString(fmt.Sprintf("accounts { SYS { users: [ %s ] } }\nsystem_account: SYS\n", natsembed.KickUserConfig)); err != nil {
		t.Fatalf("natsembed.KickUserConfig: %v", err)
	}
	want := userNamed(t, &ref, natsembed.KickUser).Permissions

	issuer, xkey := natsembed.Keys(t)
	single := DefaultParams()
	single.NATSCalloutIssuer, single.NATSCalloutXKey = issuer.Public(), xkey.Public()
	for name, p := range map[string]Params{"single server": single, "cluster": clusterParams(t, issuer.Public(), xkey.Public())} {
		t.Run(name, func(t *testing.T) {
			clustered := p.natsServers() > 1
			conf, _ := withTestCerts(t, mustNATSConfig(t, p), clustered)
			setUserPasswords(t)
			if clustered {
				setRouteEnv(t, p, testRoutePassword)
			}
			opts := processConfig(t, conf)

			u := userNamed(t, opts, kickUser)
			if u.Account == nil || u.Account.Name != "SYS" || opts.SystemAccount != "SYS" {
				t.Fatalf("compass-kick is in account %v, the system account is %q; want SYS for both", u.Account, opts.SystemAccount)
			}
			if u.Password != strings.TrimSuffix(userPasswordEnv["COMPASS_KICK_NATS_PASSWORD"], "\n") || bcrypt.CompareHashAndPassword([]byte(u.Password), []byte(kickTestPassword)) != nil {
				t.Fatal("compass-kick's password is not the hash in COMPASS_KICK_NATS_PASSWORD")
			}
			for _, other := range opts.Users {
				if other != u && other.Account != nil && other.Account.Name == "SYS" {
					t.Fatalf("user %s is in the system account too", other.Username)
				}
			}
			if opts.AuthCallout == nil || !slices.Contains(opts.AuthCallout.AuthUsers, kickUser) {
				t.Fatalf("compass-kick is not in auth_callout's auth_users: the callout would be asked to authorize it")
			}

			got := u.Permissions
			if got == nil || got.Publish == nil || got.Subscribe == nil {
				t.Fatalf("compass-kick's permissions = %s, want publish and subscribe allow lists", permissionsJSON(t, got))
			}
			if pub := slices.Sorted(slices.Values(got.Publish.Allow)); !slices.Equal(pub, slices.Sorted(slices.Values([]string{kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick}))) ||
				len(got.Publish.Deny) != 0 {
				t.Fatalf("compass-kick may publish %v (deny %v), want exactly %s, %s and %s", got.Publish.Allow, got.Publish.Deny, kick.SubjectConnzAll, kick.SubjectConnzOne, kick.SubjectKick)
			}
			if wantSub := append([]string{"_INBOX.>"}, kick.EventSubjects(p.NATSAccount)...); !slices.Equal(got.Subscribe.Allow, wantSub) || len(got.Subscribe.Deny) != 0 || got.Response != nil {
				t.Fatalf("compass-kick may subscribe %v (deny %v, responses %+v), want %v only", got.Subscribe.Allow, got.Subscribe.Deny, got.Response, wantSub)
			}
			if g, w := permissionsJSON(t, got), permissionsJSON(t, want); g != w {
				t.Fatalf("compass-kick's permissions %s differ from natsembed.KickUserConfig's %s", g, w)
			}
		})
	}
}

// kickConn connects as compass-kick. Every permissions violation the server
// reports for it (nats.go hears of them asynchronously) goes to the channel.
func kickConn(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, <-chan string) {
	t.Helper()
	violations := make(chan string, 32)
	opts = append(opts, nats.UserInfo(kickUser, kickTestPassword), nats.Name("compass-callout-kick"), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				violations <- err.Error()
			}
		}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("compass-kick cannot connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc, violations
}

// wantViolation waits for the server to report that compass-kick may not
// do what (Publish or Subscription) on subject, and fails on any other
// violation in between.
func wantViolation(t *testing.T, violations <-chan string, what, subject string) {
	t.Helper()
	select {
	case v := <-violations:
		if !strings.Contains(v, fmt.Sprintf("Permissions Violation for %s to %q", what, subject)) {
			t.Fatalf("violation %q, want one for %s to %s", v, what, subject)
		}
	case <-time.After(kickWait):
		t.Fatalf("compass-kick's %s to %s was not refused", what, subject)
	}
}

// noViolation fails the test if the server reported a permissions
// violation for compass-kick.
func noViolation(t *testing.T, nc *nats.Conn, violations <-chan string) {
	t.Helper()
	if err := nc.FlushTimeout(kickWait); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-violations:
		t.Fatalf("compass-kick was refused what it needs: %s", v)
	default:
	}
}

// sysAnswer is an answer of the system account's API to CONNZ or KICK.
type sysAnswer struct {
	Server struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"server"`
	Data struct {
		Conns []struct {
			CID  uint64 `json:"cid"`
			User string `json:"authorized_user"`
		} `json:"connections"`
	} `json:"data"`
	Error *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// sysRequest publishes body to subject and collects the answers of want
// servers (each within kickWait), as kick's listing does.
func sysRequest(t *testing.T, nc *nats.Conn, subject string, body any, want int) []sysAnswer {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		t.Fatal(err)
	}
	var out []sysAnswer
	for len(out) < want {
		m, err := sub.NextMsg(kickWait)
		if err != nil {
			t.Fatalf("%s: %d of %d servers answered: %v", subject, len(out), want, err)
		}
		var a sysAnswer
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Fatalf("%s: undecodable answer %s: %v", subject, m.Data, err)
		}
		if a.Error != nil {
			t.Fatalf("%s: server %s answered %d %s", subject, a.Server.Name, a.Error.Code, a.Error.Description)
		}
		out = append(out, a)
	}
	return out
}

// connzRequest asks for the Runners' account's connections with their
// users, as package kick does.
func connzRequest(account string) map[string]any {
	return map[string]any{"acc": account, "auth": true, "limit": kick.PageSize}
}

// hasConn says whether a lists connection cid as user.
func (a sysAnswer) hasConn(cid uint64, user string) bool {
	for _, c := range a.Data.Conns {
		if c.CID == cid && c.User == user {
			return true
		}
	}
	return false
}

// On the rendered configuration run by the real nats-server binary, the
// kick identity does what compass-callout needs: it lists the Runners'
// connections on every server ($SYS.REQ.SERVER.PING.CONNZ) and on one
// ($SYS.REQ.SERVER.<id>.CONNZ), and ends a Runner's connection
// ($SYS.REQ.SERVER.<id>.KICK). Everything else it tries is refused by the
// server: the other system requests (statistics, reload, lame-duck mode,
// the account API), a Runner's subject, and every subscription but its
// reply inboxes.
func TestNATSBinary_KickIdentityMayListAndKickOnly(t *testing.T) {
	natsBinary(t)
	signer, xk := natsembed.Keys(t)
	p := DefaultParams()
	p.NATSMonitor = NATSMonitorOff
	p.NATSCalloutIssuer, p.NATSCalloutXKey = signer.Public(), xk.Public()
	conf, pool := withTestCerts(t, mustNATSConfig(t, p), false)
	const port = "\nport: 4222\n"
	if strings.Count(string(conf), port) != 1 {
		t.Fatalf("the rendered configuration no longer has one %q line for the test to replace", strings.TrimSpace(port))
	}
	conf = []byte(strings.Replace(string(conf), port, "\nlisten: \"127.0.0.1:-1\"\n", 1))
	for k, v := range userPasswordEnv { // the binary inherits the test's environment
		t.Setenv(k, v)
	}
	srv := natsembed.StartProcess(t, string(conf))

	// The callout answers, and a Runner connects through it into RUNNERS.
	is := startRenderedCallout(t, p, srv.URL, calloutTestPassword, pool, signer, xk)
	// The users' passwords came as bcrypt hashes (compass-nats-users), the
	// callout's was checked against its hash, and nats-server found no
	// plaintext password to warn about.
	if log := srv.Log(); strings.Contains(log, "Plaintext passwords detected") {
		t.Fatalf("nats-server warns of plaintext passwords with the hashes of compass-nats-users:\n%s", log)
	}
	const runnerID = "prod/ip-10-0-1-5_ec2_internal"
	_, cid, closed := connectRunner(t, is, srv.URL, pool)

	// A wrong password does not make a kick identity.
	if nc, err := nats.Connect(srv.URL, nats.UserInfo(kickUser, "wrong"), tlsTo(pool), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("compass-kick connected with a wrong password")
	}
	kc, violations := kickConn(t, srv.URL, tlsTo(pool))

	// What it may do.
	all := sysRequest(t, kc, kick.SubjectConnzAll, connzRequest(p.NATSAccount), 1)
	id := all[0].Server.ID
	if !all[0].hasConn(cid, runnerID) {
		t.Fatalf("$SYS.REQ.SERVER.PING.CONNZ does not list the Runner's connection %d as %s: %+v", cid, runnerID, all[0].Data.Conns)
	}
	if one := sysRequest(t, kc, "$SYS.REQ.SERVER."+id+".CONNZ", connzRequest(p.NATSAccount), 1); !one[0].hasConn(cid, runnerID) {
		t.Fatalf("$SYS.REQ.SERVER.<id>.CONNZ does not list the Runner: %+v", one[0].Data.Conns)
	}
	noViolation(t, kc, violations)

	// What it may not.
	cmd, err := subjects.Command(runnerID)
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{
		"$SYS.REQ.SERVER.PING", "$SYS.REQ.SERVER.PING.STATSZ", "$SYS.REQ.SERVER.PING.VARZ", "$SYS.REQ.SERVER.PING.IDZ",
		"$SYS.REQ.SERVER." + id + ".RELOAD", "$SYS.REQ.SERVER." + id + ".LDM", "$SYS.REQ.SERVER." + id + ".VARZ",
		"$SYS.REQ.ACCOUNT.PING.CONNZ", "$SYS.REQ.ACCOUNT." + p.NATSAccount + ".CONNZ", "$SYS.REQ.USER.AUTH", cmd,
	} {
		if _, err := kc.Request(subject, []byte("{}"), 300*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("compass-kick's request to %s: %v, want no answer", subject, err)
		}
		wantViolation(t, violations, "Publish", subject)
	}
	for _, subject := range []string{">", "$SYS.ACCOUNT.>", "$SYS.REQ.SERVER.PING.CONNZ", cmd} {
		if _, err := kc.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, violations, "Subscription", subject)
	}

	// And it ends the Runner's connection.
	select {
	case <-closed:
		t.Fatal("the Runner's connection closed before the kick")
	default:
	}
	sysRequest(t, kc, "$SYS.REQ.SERVER."+id+".KICK", map[string]uint64{"cid": cid}, 1)
	select {
	case <-closed:
	case <-time.After(kickWait):
		t.Fatal("the Runner's connection is still open after the kick was answered")
	}
	noViolation(t, kc, violations)
}
