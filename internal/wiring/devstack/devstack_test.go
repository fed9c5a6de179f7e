package devstack_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/internal/lib/doorhttp"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/internal/wiring/devstack"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/subjects"
)

// Dev in-process: the door enrolls the projected token as dev/dev-node, NATS
// admits the same token through the callout with the Runner's permissions,
// ping goes door -> NATS -> Runner, and the token file is rewritten at 80 %
// of its lifetime.
func TestDevStackInProcess(t *testing.T) {
	dir := t.TempDir()
	ticks := make(chan time.Time)
	waits := make(chan time.Duration, 4)
	ready := make(chan devstack.Info, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	var out testlog.Buffer
	go func() {
		done <- devstack.Run(ctx, devstack.Config{
			DataDir: dir, Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:0", Out: &out,
			After: func(d time.Duration) <-chan time.Time {
				waits <- d
				return ticks
			},
			Ready: func(i devstack.Info) { ready <- i },
		})
	}()
	var info devstack.Info
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("Dev: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Dev did not become ready")
	}
	if info.RunnerID != "dev/dev-node" || !strings.Contains(out.String(), devstack.RunnerCommand(info)) || !strings.Contains(out.String(), devstack.PingCommand(info)) {
		t.Fatalf("dev printed:\n%s", out.String())
	}
	if d := <-waits; d != 480*time.Second {
		t.Fatalf("token file rewrite after %v, want 480s (80%% of 600s)", d)
	}

	hc, err := doorhttp.Client(info.DoorURL, info.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	tok := testutil.ReadTrim(t, info.RunnerTokenFile)
	req := connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "Bearer "+tok)
	res, err := runnerv1connect.NewRunnerServiceClient(hc, info.DoorURL, connect.WithGRPC()).Enroll(t.Context(), req)
	if err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	if res.Msg.GetRunnerId() != info.RunnerID || res.Msg.GetNatsUrl() != info.NATSURL {
		t.Fatalf("EnrollResponse = %v", res.Msg)
	}

	// The same token on NATS, through the callout: the Runner's subjects only.
	inbox, _ := subjects.InboxPrefix(info.RunnerID)
	nc, err := nats.Connect(info.NATSURL, nats.Token(tok), nats.CustomInboxPrefix(inbox))
	if err != nil {
		t.Fatalf("NATS connect with the projected token: %v", err)
	}
	defer nc.Close()
	cmd, _ := subjects.Command(info.RunnerID)
	if _, err := nc.Subscribe(cmd, func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true,"result":{"pong":true}}`)) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	admin := adminv1connect.NewAdminServiceClient(hc, info.DoorURL, connect.WithGRPC())
	preq := connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: info.RunnerID})
	preq.Header().Set("Authorization", "Bearer "+testutil.ReadTrim(t, info.AdminTokenFile))
	pres, err := admin.PingRunner(t.Context(), preq)
	if err != nil || !strings.Contains(pres.Msg.GetAnswerJson(), `"pong":true`) {
		t.Fatalf("PingRunner = %v, %v", pres, err)
	}
	// The projected token does not open the admin door.
	preq.Header().Set("Authorization", "Bearer "+tok)
	if _, err := admin.PingRunner(t.Context(), preq); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("PingRunner with the projected token: %v", err)
	}

	// The kubelet's rewrite: a new token in the file, which still enrolls.
	ticks <- time.Now()
	<-waits // the next wait starts after the rewrite
	tok2 := testutil.ReadTrim(t, info.RunnerTokenFile)
	if tok2 == tok {
		t.Fatal("the token file was not rewritten")
	}
	req.Header().Set("Authorization", "Bearer "+tok2)
	if _, err := runnerv1connect.NewRunnerServiceClient(hc, info.DoorURL, connect.WithGRPC()).Enroll(t.Context(), req); err != nil {
		t.Fatalf("Enroll with the rewritten token: %v", err)
	}

	// A second connection as the same Runner ID: the dev stack's kicker ends
	// the older one after the duplicate grace, as compass-callout does.
	kicked := make(chan struct{}, 1)
	nc.SetDisconnectErrHandler(func(*nats.Conn, error) {
		select {
		case kicked <- struct{}{}:
		default:
		}
	})
	dup, err := nats.Connect(info.NATSURL, nats.Token(tok2), nats.NoReconnect())
	if err != nil {
		t.Fatalf("NATS connect with the rewritten token: %v", err)
	}
	defer dup.Close()
	select {
	case <-kicked:
	case <-time.After(kick.DefaultDuplicateGrace + 15*time.Second):
		t.Fatal("the older connection of dev/dev-node was not ended")
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Dev stopped with %v", err)
	}
}
