package door_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/compass-runner/identity/door"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/verifier"
)

// The door's tests elsewhere use connect-go's gRPC mode; these use grpc-go,
// as operators' tools (grpcurl) and other services do: HTTP/2 over TLS (ALPN
// h2), ClientConn.Invoke with the generated messages and the full method names
// of the protobuf service descriptors, and the token as per-RPC credentials.

// bearerCreds sends "authorization: Bearer <token>" with every call, as the
// Runner does, and only over a secure transport.
type bearerCreds struct{ token string }

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (bearerCreds) RequireTransportSecurity() bool { return true }

// grpcConn returns a grpc-go connection to the harness's door that trusts the
// test server's certificate.
func (h *harness) grpcConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	tr, ok := h.client.Transport.(*http.Transport)
	if !ok || tr.TLSClientConfig == nil || tr.TLSClientConfig.RootCAs == nil {
		t.Fatalf("the test server's client has no TLS roots (transport %T)", h.client.Transport)
	}
	addr, ok := strings.CutPrefix(h.url, "https://")
	if !ok {
		t.Fatalf("door URL %s is not https", h.url)
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: tr.TLSClientConfig.RootCAs, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// fullMethod is the gRPC method name ("/pkg.Service/Method") from the
// generated protobuf descriptors, as grpc-go stubs would name it.
func fullMethod(t *testing.T, fd protoreflect.FileDescriptor, service, method string) string {
	t.Helper()
	sd := fd.Services().ByName(protoreflect.Name(service))
	if sd == nil {
		t.Fatalf("%s has no service %s", fd.Path(), service)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		t.Fatalf("%s has no method %s", sd.FullName(), method)
	}
	return "/" + string(sd.FullName()) + "/" + string(md.Name())
}

// grpcCase is one grpc-go call: its token ("" sends no credentials), the
// exact status code and message it must get, and for OK a check of the
// response.
type grpcCase struct {
	name   string
	method string
	token  string
	req    proto.Message
	reply  func() proto.Message
	code   codes.Code
	msg    string // exact status message; for OK unused
	check  func(t *testing.T, reply proto.Message)
}

// runGRPCCases invokes each case in order with grpc-go and asserts its status, its
// response, and that the call went over TLS with ALPN h2.
func runGRPCCases(t *testing.T, cc *grpc.ClientConn, cases []grpcCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var opts []grpc.CallOption
			if c.token != "" {
				opts = append(opts, grpc.PerRPCCredentials(bearerCreds{token: c.token}))
			}
			var p peer.Peer
			opts = append(opts, grpc.Peer(&p))
			reply := c.reply()
			err := cc.Invoke(t.Context(), c.method, c.req, reply, opts...)
			st := status.Convert(err)
			// The door's messages never hold a token (they are fixed, or
			// quote the request's runner_id), so they may be printed.
			if got := status.Code(err); got != c.code {
				t.Fatalf("%s: code = %s (message %q), want %s", c.method, got, st.Message(), c.code)
			}
			if c.code != codes.OK && st.Message() != c.msg {
				t.Fatalf("%s: message = %q, want %q", c.method, st.Message(), c.msg)
			}
			info, ok := p.AuthInfo.(credentials.TLSInfo)
			if !ok {
				t.Fatalf("%s: peer auth info is %T, want TLS", c.method, p.AuthInfo)
			}
			if alpn := info.State.NegotiatedProtocol; alpn != "h2" {
				t.Fatalf("%s: ALPN protocol = %q, want h2", c.method, alpn)
			}
			if c.code == codes.OK {
				c.check(t, reply)
			}
		})
	}
}

// flipSignature returns tok with the first character of its JWS signature
// changed: same header (kid) and claims, a signature that does not verify.
func flipSignature(tok string) string {
	i := strings.LastIndexByte(tok, '.') + 1
	c := byte('A')
	if tok[i] == 'A' {
		c = 'B'
	}
	return tok[:i] + string(c) + tok[i+1:]
}

const (
	grpcUnauthenticated = "unauthenticated"
	grpcUnavailable     = "runner cluster keys unavailable; retry later"
)

// RunnerService.Enroll through grpc-go: projected and minted Runner tokens
// enroll; bad tokens and an account token are Unauthenticated; a projected
// token of a cluster whose keys never loaded is Unavailable; a runner_id that
// is not the token's is PermissionDenied.
func TestGRPCGoEnroll(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	cc := h.grpcConn(t)
	enroll := fullMethod(t, runnerv1.File_compass_runner_v1_runner_proto, "RunnerService", "Enroll")
	if enroll != "/compass.runner.v1.RunnerService/Enroll" {
		t.Fatalf("Enroll method = %s", enroll)
	}

	pod := kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal", NodeUID: "node-uid-1", PodName: "compass-runner-x7", PodUID: "pod-uid-1"}
	const wantID = "prod/ip-10-0-1-5_ec2_internal"
	projected := h.projected(t, h.prod, pod)
	dark := h.projected(t, h.dark, pod)
	minted := h.mint(t, verifier.SubjectRunner, "build-01")
	account := h.mint(t, verifier.SubjectAccount, "ops")
	unknown, err := verifier.GenerateToken() // minted-shaped, never stored
	if err != nil {
		t.Fatal(err)
	}

	newReply := func() proto.Message { return &runnerv1.EnrollResponse{} }
	wantEnrolled := func(id string) func(*testing.T, proto.Message) {
		return func(t *testing.T, m proto.Message) {
			t.Helper()
			res := m.(*runnerv1.EnrollResponse)
			if res.GetRunnerId() != id || res.GetNatsUrl() != "nats://nats.example:4222" || res.GetServerVersion() != "test" {
				t.Fatalf("EnrollResponse = {runner_id %q, nats_url %q, server_version %q}, want {%q, nats://nats.example:4222, test}",
					res.GetRunnerId(), res.GetNatsUrl(), res.GetServerVersion(), id)
			}
		}
	}
	req := func(runnerID string) *runnerv1.EnrollRequest {
		return &runnerv1.EnrollRequest{RunnerId: runnerID, Version: "v-grpc-go", Hostname: "grpc-host"}
	}
	mismatch := func(id string) string {
		return `runner_id "` + id + `" does not match the Runner ID this token speaks for; send an empty runner_id to be told it`
	}
	runGRPCCases(t, cc, []grpcCase{
		{name: "projected token", method: enroll, token: projected, req: req(""), reply: newReply,
			code: codes.OK, check: wantEnrolled(wantID)},
		{name: "projected token, its own runner_id", method: enroll, token: projected, req: req(wantID), reply: newReply,
			code: codes.OK, check: wantEnrolled(wantID)},
		{name: "minted Runner token", method: enroll, token: minted, req: req(""), reply: newReply,
			code: codes.OK, check: wantEnrolled("build-01")},
		{name: "no credentials", method: enroll, req: req(""), reply: newReply,
			code: codes.Unauthenticated, msg: grpcUnauthenticated},
		{name: "bad signature", method: enroll, token: flipSignature(projected), req: req(""), reply: newReply,
			code: codes.Unauthenticated, msg: grpcUnauthenticated},
		{name: "unknown minted token", method: enroll, token: unknown, req: req(""), reply: newReply,
			code: codes.Unauthenticated, msg: grpcUnauthenticated},
		{name: "keys unavailable", method: enroll, token: dark, req: req(""), reply: newReply,
			code: codes.Unavailable, msg: grpcUnavailable},
		{name: "account token (wrong kind)", method: enroll, token: account, req: req(""), reply: newReply,
			code: codes.Unauthenticated, msg: grpcUnauthenticated},
		{name: "runner_id of another node", method: enroll, token: projected, req: req("prod/other"), reply: newReply,
			code: codes.PermissionDenied, msg: mismatch("prod/other")},
		{name: "runner_id is the node name", method: enroll, token: projected, req: req(pod.NodeName), reply: newReply,
			code: codes.PermissionDenied, msg: mismatch(pod.NodeName)},
		{name: "minted token, another runner_id", method: enroll, token: minted, req: req("build-02"), reply: newReply,
			code: codes.PermissionDenied, msg: mismatch("build-02")},
	})

	// What grpc-go sent reached the registry intact.
	r, err := h.st.GetRunner(t.Context(), wantID)
	if err != nil {
		t.Fatal(err)
	}
	if r.Method != store.MethodProjected || r.Cluster != "prod" || r.NodeName != pod.NodeName || r.NodeUID != pod.NodeUID ||
		r.PodName != pod.PodName || r.PodUID != pod.PodUID || r.Version != "v-grpc-go" || r.Hostname != "grpc-host" {
		t.Fatalf("registry row = %+v", r)
	}
	h.noTokenInLogs(t, projected, dark, minted, account, unknown)
}

// pingStub stands in for NATS: it records the request and answers as a
// connected Runner does.
type pingStub struct {
	mu      sync.Mutex
	n       int
	subject string
	data    string
}

const pingAnswer = `{"ok":true,"result":{"pong":true,"runner_id":"prod/node-a"}}`

func (p *pingStub) Request(_ context.Context, subject string, data []byte) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	p.subject, p.data = subject, string(data)
	return []byte(pingAnswer), nil
}

func (p *pingStub) last() (n int, subject, data string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, p.subject, p.data
}

// AdminService.ListRunners and .PingRunner through grpc-go: an account token
// is served; a bad token, a Runner token (minted or projected) and a
// projected token of a cluster without keys are Unauthenticated.
func TestGRPCGoAdminService(t *testing.T) {
	clock := &stepClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), step: 7 * time.Millisecond}
	ping := &pingStub{}
	h := newHarness(t, harnessOpts{requester: ping, now: clock.Now})
	cc := h.grpcConn(t)
	fd := adminv1.File_compass_admin_v1_admin_proto
	list := fullMethod(t, fd, "AdminService", "ListRunners")
	pingRunner := fullMethod(t, fd, "AdminService", "PingRunner")
	if list != "/compass.admin.v1.AdminService/ListRunners" || pingRunner != "/compass.admin.v1.AdminService/PingRunner" {
		t.Fatalf("admin methods = %s, %s", list, pingRunner)
	}

	// One Runner in the registry, enrolled at a known time.
	const id = "prod/node-a"
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	if _, err := h.st.RecordEnrollment(t.Context(), store.Enrollment{RunnerID: id, Method: store.MethodProjected,
		Cluster: "prod", NodeName: "node-a", NodeUID: "nu", PodName: "compass-runner-node-a", PodUID: "pu",
		Version: "v1.2.3", Hostname: "node-a-host", At: at}); err != nil {
		t.Fatal(err)
	}

	account := h.mint(t, verifier.SubjectAccount, "ops")
	revoked, info, err := h.st.Mint(t.Context(), verifier.SubjectAccount, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.st.Revoke(t.Context(), info.ID); err != nil {
		t.Fatal(err)
	}
	runner := h.mint(t, verifier.SubjectRunner, "build-01")
	projected := h.projected(t, h.prod, kubeissuer.Pod{NodeName: "node-a"})
	dark := h.projected(t, h.dark, kubeissuer.Pod{NodeName: "node-a"})
	unknown, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}

	listReply := func() proto.Message { return &adminv1.ListRunnersResponse{} }
	pingReply := func() proto.Message { return &adminv1.PingRunnerResponse{} }
	cmd, err := subjects.Command(id)
	if err != nil {
		t.Fatal(err)
	}
	var cases []grpcCase
	cases = append(cases,
		grpcCase{name: "ListRunners/account token", method: list, token: account, req: &adminv1.ListRunnersRequest{}, reply: listReply,
			code: codes.OK, check: func(t *testing.T, m proto.Message) {
				t.Helper()
				rs := m.(*adminv1.ListRunnersResponse).GetRunners()
				if len(rs) != 1 {
					t.Fatalf("ListRunners returned %d runners, want 1", len(rs))
				}
				r := rs[0]
				if r.GetId() != id || r.GetMethod() != store.MethodProjected || r.GetCluster() != "prod" ||
					r.GetNodeName() != "node-a" || r.GetNodeUid() != "nu" || r.GetPodName() != "compass-runner-node-a" ||
					r.GetPodUid() != "pu" || r.GetVersion() != "v1.2.3" || r.GetHostname() != "node-a-host" ||
					!r.GetFirstEnrolled().AsTime().Equal(at) || !r.GetLastEnrolled().AsTime().Equal(at) {
					t.Fatalf("ListRunners runner = %v", r)
				}
			}},
		grpcCase{name: "PingRunner/account token", method: pingRunner, token: account, req: &adminv1.PingRunnerRequest{RunnerId: id}, reply: pingReply,
			code: codes.OK, check: func(t *testing.T, m proto.Message) {
				t.Helper()
				res := m.(*adminv1.PingRunnerResponse)
				if res.GetAnswerJson() != pingAnswer || res.GetRtt().AsDuration() != 7*time.Millisecond {
					t.Fatalf("PingRunnerResponse = {answer_json %s, rtt %v}, want {%s, 7ms}", res.GetAnswerJson(), res.GetRtt().AsDuration(), pingAnswer)
				}
				if n, subject, data := ping.last(); n != 1 || subject != cmd || data != string(door.PingRequest) {
					t.Fatalf("NATS requests = %d, last %s %s; want 1, %s %s", n, subject, data, cmd, door.PingRequest)
				}
			}},
	)
	// Every refusal, on both methods.
	for _, m := range []struct {
		name, method string
		req          proto.Message
		reply        func() proto.Message
	}{
		{"ListRunners", list, &adminv1.ListRunnersRequest{}, listReply},
		{"PingRunner", pingRunner, &adminv1.PingRunnerRequest{RunnerId: id}, pingReply},
	} {
		for _, c := range []struct {
			name, token string
		}{
			{"no credentials", ""},
			{"unknown token", unknown},
			{"revoked account token", revoked},
			{"minted Runner token (wrong kind)", runner},
			{"projected token (wrong kind)", projected},
			// A projected token is the wrong kind here before any key is
			// looked at: keys unavailable is not Unavailable on this door.
			{"projected token, keys unavailable", dark},
		} {
			cases = append(cases, grpcCase{name: m.name + "/" + c.name, method: m.method, token: c.token, req: m.req, reply: m.reply,
				code: codes.Unauthenticated, msg: grpcUnauthenticated})
		}
	}
	runGRPCCases(t, cc, cases)
	if n, _, _ := ping.last(); n != 1 {
		t.Fatalf("NATS requests = %d, want 1: a refused PingRunner reached NATS", n)
	}
	h.noTokenInLogs(t, account, revoked, runner, projected, dark, unknown)
}
