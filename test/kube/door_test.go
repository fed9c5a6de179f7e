package kube

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/door"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// natsWait bounds each wait on the in-process nats-server or the callout.
const natsWait = 10 * time.Second

// compassStack is the Server's door and compass-callout on an in-process
// nats-server, each with its own verifier built from the same cluster file
// (two processes in production), sharing one store.
type compassStack struct {
	st         store.Store
	doorURL    string
	doorClient *http.Client
	natsURL    string
	events     chan callout.Event
	// verifiers are the callout's and the door's, in that order.
	verifiers []*verifier.RunnerVerifier
}

func newCompassStack(t *testing.T, clusterFile string) *compassStack {
	t.Helper()
	ctx := t.Context()
	s := &compassStack{events: make(chan callout.Event, 16)}
	dbURL := "sqlite://" + filepath.Join(t.TempDir(), "compass.db")
	s.st = storetest.Open(t, dbURL)
	calloutStore := storetest.Open(t, dbURL)
	tenant, err := s.st.BootstrapTenant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	verifierFor := func() *verifier.RunnerVerifier {
		data, err := os.ReadFile(clusterFile)
		if err != nil {
			t.Fatal(err)
		}
		clusters, err := verifier.ParseRunnerClusters(data)
		if err != nil {
			t.Fatal(err)
		}
		v, err := verifier.New(clusters, verifier.WithTenant(tenant))
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		s.verifiers = append(s.verifiers, v)
		return v
	}

	// nats-server in server-config callout mode with xkey. "server" is the
	// Server's own connection in the Runners' account.
	nc := natsembed.Start(t, natsembed.Config{
		Resolver:   verifier.NewResolver(verifierFor(), calloutStore),
		ServerUser: true,
		Observe: func(ev callout.Event) {
			select {
			case s.events <- ev:
			default:
			}
		},
	})
	s.natsURL = nc.URL

	h, err := door.NewHandler(door.Config{
		Resolver: verifier.NewResolver(verifierFor(), s.st),
		Enroller: s.st, Runners: s.st, NATSURL: s.natsURL,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.ServeTLS(t, h)
	s.doorURL, s.doorClient = srv.URL, srv.Client()
	return s
}

// enroll calls RunnerService.Enroll over gRPC with tok as the bearer token.
func (s *compassStack) enroll(ctx context.Context, tok string) (*runnerv1.EnrollResponse, error) {
	req := connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "Bearer "+tok)
	resp, err := runnerv1connect.NewRunnerServiceClient(s.doorClient, s.doorURL, connect.WithGRPC()).Enroll(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// DL-440 live smoke, end to end: the kubelet's token for the Runner pod
// enrolls through the Server's door as live/ip-10-0-1-5_ec2_internal (with the
// pod and node recorded), then connects to nats-server through compass-callout
// with that Runner's permissions and no others.
func TestLiveRunnerEnrollsAndConnects(t *testing.T) {
	e := liveCluster(t)
	ctx := t.Context()
	tok, err := kubeletToken(ctx, e.srv, runnerNode, e.pod)
	if err != nil {
		t.Fatal(err)
	}
	s := newCompassStack(t, e.clusterFile)

	resp, err := s.enroll(ctx, tok)
	if err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	if resp.GetRunnerId() != runnerID || resp.GetNatsUrl() != s.natsURL {
		t.Fatalf("Enroll = runner %q nats %q, want %q %q", resp.GetRunnerId(), resp.GetNatsUrl(), runnerID, s.natsURL)
	}
	row, err := s.st.GetRunner(ctx, runnerID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Method != "projected" || row.Cluster != "live" || row.NodeName != runnerNode || row.NodeUID != string(e.node.UID) ||
		row.PodName != e.pod.Name || row.PodUID != string(e.pod.UID) {
		t.Errorf("stored Runner = %+v, want projected, live, %s (%s), pod %s (%s)", row, runnerNode, e.node.UID, e.pod.Name, e.pod.UID)
	}

	// The Runner's NATS connection, with the same token.
	inbox, err := subjects.InboxPrefix(runnerID)
	if err != nil {
		t.Fatal(err)
	}
	asyncErrs := make(chan error, 8)
	rc, err := nats.Connect(s.natsURL, nats.Token(tok), nats.CustomInboxPrefix(inbox), nats.NoReconnect(), nats.Timeout(natsWait),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case asyncErrs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("Runner NATS connect: %v", err)
	}
	defer rc.Close()
	select {
	case ev := <-s.events:
		if ev.Outcome != callout.OutcomeAuthorized || ev.RunnerID != runnerID || ev.Cluster != "live" {
			t.Fatalf("callout decision = %s %q cluster %q (%s), want authorized %q cluster live", ev.Outcome, ev.RunnerID, ev.Cluster, ev.Reason, runnerID)
		}
	case <-time.After(natsWait):
		t.Fatal("the callout decided nothing")
	}

	server, err := nats.Connect(s.natsURL, nats.UserInfo(natsembed.ServerUser, natsembed.ServerPassword))
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	cmd, err := subjects.Command(runnerID)
	if err != nil {
		t.Fatal(err)
	}
	evtSubject, err := subjects.Event(runnerID, "started")
	if err != nil {
		t.Fatal(err)
	}
	events, err := subjects.Events(runnerID)
	if err != nil {
		t.Fatal(err)
	}

	// The Server's command reaches the Runner and its reply comes back.
	sub, err := rc.Subscribe(cmd, func(m *nats.Msg) { _ = m.Respond([]byte("pong")) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := rc.Flush(); err != nil {
		t.Fatal(err)
	}
	reply, err := server.Request(cmd, []byte("ping"), natsWait)
	if err != nil || string(reply.Data) != "pong" {
		t.Fatalf("command round trip: %v", err)
	}
	// The Runner's event reaches the Server.
	evts, err := server.SubscribeSync(events)
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Publish(evtSubject, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if m, err := evts.NextMsg(natsWait); err != nil || m.Subject != evtSubject {
		t.Fatalf("event: %v", err)
	}
	// Another Runner's command subject is not the Runner's to publish on.
	otherCmd, err := subjects.Command(verifier.WorkloadRunnerID("live", otherNode))
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Publish(otherCmd, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-asyncErrs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation for publish") {
			t.Fatalf("publish to another Runner's subject: async error %v, want a publish permissions violation", err)
		}
	case <-time.After(natsWait):
		t.Fatal("publish to another Runner's subject raised no permissions violation")
	}
}
