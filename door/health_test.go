package door_test

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/compass-runner/identity/door"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/verifier"
)

// reflectRaw sends req on a fresh ServerReflectionInfo stream (v1, or
// v1alpha when alpha) and returns the one response.
func reflectRaw(t *testing.T, cc *grpc.ClientConn, alpha bool, req *reflectionv1.ServerReflectionRequest) *reflectionv1.ServerReflectionResponse {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var res *reflectionv1.ServerReflectionResponse
	if alpha {
		// v1alpha's messages are v1's, field for field, under another package.
		b, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		//lint:ignore SA1019 v1alpha is deprecated, and older clients still use it: the door serves it for them.
		var areq reflectionv1alpha.ServerReflectionRequest
		if err := proto.Unmarshal(b, &areq); err != nil {
			t.Fatal(err)
		}
		stream, err := reflectionv1alpha.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatalf("v1alpha ServerReflectionInfo: %v", err)
		}
		if err := stream.Send(&areq); err != nil {
			t.Fatalf("v1alpha send: %v", err)
		}
		ares, err := stream.Recv()
		if err != nil {
			t.Fatalf("v1alpha receive: %v", err)
		}
		if b, err = proto.Marshal(ares); err != nil {
			t.Fatal(err)
		}
		res = &reflectionv1.ServerReflectionResponse{}
		if err := proto.Unmarshal(b, res); err != nil {
			t.Fatal(err)
		}
	} else {
		stream, err := reflectionv1.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatalf("ServerReflectionInfo: %v", err)
		}
		if err := stream.Send(req); err != nil {
			t.Fatalf("send: %v", err)
		}
		if res, err = stream.Recv(); err != nil {
			t.Fatalf("receive: %v", err)
		}
	}
	return res
}

// reflectOnce is reflectRaw failing on an error response.
func reflectOnce(t *testing.T, cc *grpc.ClientConn, alpha bool, req *reflectionv1.ServerReflectionRequest) *reflectionv1.ServerReflectionResponse {
	t.Helper()
	res := reflectRaw(t, cc, alpha, req)
	if e := res.GetErrorResponse(); e != nil {
		t.Fatalf("reflection error response: %d %s", e.GetErrorCode(), e.GetErrorMessage())
	}
	return res
}

// listServices asks the door's reflection for its service names.
func listServices(t *testing.T, cc *grpc.ClientConn, alpha bool) []string {
	t.Helper()
	res := reflectOnce(t, cc, alpha, &reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}})
	var names []string
	for _, s := range res.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

// fileOf returns the descriptor file reflection serves for symbol.
func fileOf(t *testing.T, cc *grpc.ClientConn, symbol string) *descriptorpb.FileDescriptorProto {
	t.Helper()
	res := reflectOnce(t, cc, false, &reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}})
	for _, b := range res.GetFileDescriptorResponse().GetFileDescriptorProto() {
		var fdp descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(b, &fdp); err != nil {
			t.Fatal(err)
		}
		for _, s := range fdp.GetService() {
			if fdp.GetPackage()+"."+s.GetName() == symbol {
				return &fdp
			}
		}
	}
	t.Fatalf("reflection served no file with service %s", symbol)
	return nil
}

func healthCase(name, service string, code codes.Code, msg string, want healthv1.HealthCheckResponse_ServingStatus) grpcCase {
	return grpcCase{name: name, method: healthv1.Health_Check_FullMethodName, req: &healthv1.HealthCheckRequest{Service: service},
		reply: func() proto.Message { return &healthv1.HealthCheckResponse{} }, code: code, msg: msg,
		check: func(t *testing.T, m proto.Message) {
			t.Helper()
			if got := m.(*healthv1.HealthCheckResponse).GetStatus(); got != want {
				t.Fatalf("Check(%q) = %s, want %s", service, got, want)
			}
		}}
}

// The door serves grpc.health.v1 and reflection (v1 and v1alpha) to a grpc-go
// client that sends no token: Check is SERVING while the readiness function
// (here the real SQLite store's answer, as compass-server wires it) holds and
// NOT_SERVING once the store is closed; reflection lists the door's services
// and serves their descriptors. The RPCs that read or change state are still
// refused without a token.
func TestGRPCGoHealthAndReflectionWithoutToken(t *testing.T) {
	var h *harness
	h = newHarness(t, harnessOpts{ready: func(ctx context.Context) error {
		_, err := h.st.SchemaVersion(ctx)
		return err
	}})
	cc := h.grpcConn(t)
	serving, notServing := healthv1.HealthCheckResponse_SERVING, healthv1.HealthCheckResponse_NOT_SERVING
	runGRPCCases(t, cc, []grpcCase{
		healthCase("the door", "", codes.OK, "", serving),
		healthCase("RunnerService", "compass.runner.v1.RunnerService", codes.OK, "", serving),
		healthCase("AdminService", "compass.admin.v1.AdminService", codes.OK, "", serving),
		healthCase("unknown service", "compass.nope.v1.Nope", codes.NotFound, `unknown service "compass.nope.v1.Nope"`, 0),
	})
	// Watch is not served (probes and grpcurl use Check).
	w, err := healthv1.NewHealthClient(cc).Watch(t.Context(), &healthv1.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Watch = %v, want Unimplemented", err)
	}

	want := []string{"grpc.health.v1.Health", "compass.runner.v1.RunnerService", "compass.admin.v1.AdminService"}
	for _, alpha := range []bool{false, true} {
		if got := listServices(t, cc, alpha); !slices.Equal(got, want) {
			t.Fatalf("list_services (v1alpha %v) = %q, want %q", alpha, got, want)
		}
	}
	// The descriptor of a service, as grpcurl fetches it to build a request.
	var methods []string
	for _, s := range fileOf(t, cc, "compass.admin.v1.AdminService").GetService() {
		for _, m := range s.GetMethod() {
			methods = append(methods, s.GetName()+"."+m.GetName())
		}
	}
	if !slices.Equal(methods, []string{"AdminService.ListRunners", "AdminService.PingRunner"}) {
		t.Fatalf("the reflected %s has methods %q", adminv1.File_compass_admin_v1_admin_proto.Path(), methods)
	}
	// Reflection serves the door's API, not whatever else the binary links.
	// grpc-go's reflection descriptors are linked into this test binary.
	for _, symbol := range []string{"grpc.reflection.v1.ServerReflection", "google.protobuf.FileDescriptorProto"} {
		res := reflectRaw(t, cc, false, &reflectionv1.ServerReflectionRequest{
			MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}})
		if e := res.GetErrorResponse(); codes.Code(e.GetErrorCode()) != codes.NotFound {
			t.Fatalf("file_containing_symbol %s = %v, want a NotFound error response", symbol, res)
		}
	}
	// Health and reflection are open; the door's own RPCs are not. The
	// authentication counter shows both refusals went through BearerAuth.
	enroll := fullMethod(t, runnerv1.File_compass_runner_v1_runner_proto, "RunnerService", "Enroll")
	list := fullMethod(t, adminv1.File_compass_admin_v1_admin_proto, "AdminService", "ListRunners")
	account := h.mint(t, verifier.SubjectAccount, "ops")
	runGRPCCases(t, cc, []grpcCase{
		{name: "Enroll without a token", method: enroll, req: &runnerv1.EnrollRequest{},
			reply: func() proto.Message { return &runnerv1.EnrollResponse{} }, code: codes.Unauthenticated, msg: grpcUnauthenticated},
		{name: "ListRunners without a token", method: list, req: &adminv1.ListRunnersRequest{},
			reply: func() proto.Message { return &adminv1.ListRunnersResponse{} }, code: codes.Unauthenticated, msg: grpcUnauthenticated},
		{name: "ListRunners with an account token", method: list, token: account, req: &adminv1.ListRunnersRequest{},
			reply: func() proto.Message { return &adminv1.ListRunnersResponse{} }, code: codes.OK,
			check: func(t *testing.T, m proto.Message) {
				t.Helper()
				if n := len(m.(*adminv1.ListRunnersResponse).GetRunners()); n != 0 {
					t.Fatalf("ListRunners = %d runners, want none", n)
				}
			}},
	})
	wantAuth := map[[2]string]float64{{"runner", "unauthenticated"}: 1, {"account", "unauthenticated"}: 1, {"account", "ok"}: 1}
	for _, want := range []string{"runner", "account"} {
		for _, code := range []string{"ok", "unauthenticated", "unavailable"} {
			if got := testutil.Counter(t, h.reg, door.MetricAuth, map[string]string{"want": want, "code": code}); got != wantAuth[[2]string{want, code}] {
				t.Fatalf("%s{want=%s,code=%s} = %v, want %v", door.MetricAuth, want, code, got, wantAuth[[2]string{want, code}])
			}
		}
	}

	// The store stops answering: the same readiness now fails.
	if err := h.st.Close(); err != nil {
		t.Fatal(err)
	}
	runGRPCCases(t, cc, []grpcCase{
		healthCase("the door, store closed", "", codes.OK, "", notServing),
		healthCase("AdminService, store closed", "compass.admin.v1.AdminService", codes.OK, "", notServing),
	})
}

// The grpc.health.v1 descriptor reflection serves (the door's own copy, as
// compass-server links no grpc-go) is grpc-go's: the same file name, package,
// messages, and Check and Watch methods. grpcurl builds its Check request
// from it.
func TestHealthDescriptorIsGRPCs(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	served := fileOf(t, h.grpcConn(t), "grpc.health.v1.Health")
	grpcgo := protodesc.ToFileDescriptorProto(healthv1.File_grpc_health_v1_health_proto)
	if served.GetName() != grpcgo.GetName() || served.GetPackage() != grpcgo.GetPackage() || served.GetSyntax() != grpcgo.GetSyntax() {
		t.Fatalf("served %s (package %s, %s), grpc-go's %s (package %s, %s)", served.GetName(), served.GetPackage(), served.GetSyntax(),
			grpcgo.GetName(), grpcgo.GetPackage(), grpcgo.GetSyntax())
	}
	for _, name := range []string{"HealthCheckRequest", "HealthCheckResponse"} {
		var a, b *descriptorpb.DescriptorProto
		for _, m := range served.GetMessageType() {
			if m.GetName() == name {
				a = m
			}
		}
		for _, m := range grpcgo.GetMessageType() {
			if m.GetName() == name {
				b = m
			}
		}
		if a == nil || b == nil || !proto.Equal(a, b) {
			t.Fatalf("message %s: served %v, grpc-go's %v", name, a, b)
		}
	}
	if len(served.GetService()) != 1 || len(grpcgo.GetService()) != 1 {
		t.Fatalf("services: served %d, grpc-go's %d", len(served.GetService()), len(grpcgo.GetService()))
	}
	var names []string
	for _, m := range served.GetService()[0].GetMethod() {
		names = append(names, m.GetName())
		var theirs *descriptorpb.MethodDescriptorProto
		for _, g := range grpcgo.GetService()[0].GetMethod() {
			if g.GetName() == m.GetName() {
				theirs = g
			}
		}
		if theirs == nil || !proto.Equal(m, theirs) {
			t.Fatalf("method %s: served %v, grpc-go's %v", m.GetName(), m, theirs)
		}
	}
	if !slices.Equal(names, []string{"Check", "Watch"}) {
		t.Fatalf("served Health methods %q, want Check and Watch", names)
	}
}
