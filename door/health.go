package door

import (
	"context"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"golang.org/x/sync/singleflight"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
)

// The door's services, as grpc.health.v1 and reflection name them.
var servedServices = []string{runnerv1connect.RunnerServiceName, adminv1connect.AdminServiceName}

// healthChecker answers grpc.health.v1.Health/Check: SERVING while ready
// reports nil, NOT_SERVING otherwise, for the whole door ("") and for each of
// its services alike (they share the store, the certificate and NATS).
//
// The check is open to anyone who reaches the door, and ready may query the
// store: concurrent checks share one run of ready (a single flight), so a
// flood of unauthenticated health checks costs the database one query at a
// time, never one per request.
type healthChecker struct {
	ready  func(ctx context.Context) error // nil: SERVING while the door answers
	flight *singleflight.Group
}

// Check implements grpchealth.Checker. An unknown service is NotFound, as
// grpc-go's health server answers it.
func (c *healthChecker) Check(ctx context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	known := req.Service == ""
	for _, s := range servedServices {
		known = known || req.Service == s
	}
	if !known {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %q", req.Service))
	}
	if c.ready != nil {
		_, err, _ := c.flight.Do("ready", func() (any, error) {
			// Not the caller's ctx: the callers merged into this run may
			// outlive the one that started it.
			return nil, c.ready(context.WithoutCancel(ctx))
		})
		if err != nil {
			// The reasons stay on the metrics listener's /readyz (and the
			// log): the door is reachable from outside the cluster.
			return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
		}
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

// handleOpen mounts grpc.health.v1.Health and server reflection (v1 and
// v1alpha) on mux. They carry no bearer interceptor: a load balancer's or
// kubelet's gRPC probe and `grpcurl list` have no token. What they disclose is
// the readiness bit and the door's public API (the descriptors of its
// services, as in proto/, and of grpc.health.v1), nothing else linked into
// the binary; every RPC that reads or changes state stays behind BearerAuth.
func handleOpen(mux *http.ServeMux, ready func(context.Context) error, opts ...connect.HandlerOption) error {
	files, err := openFiles()
	if err != nil {
		return err
	}
	reflector := grpcreflect.NewReflector(
		grpcreflect.NamerFunc(func() []string { return append([]string{grpchealth.HealthV1ServiceName}, servedServices...) }),
		grpcreflect.WithDescriptorResolver(files))
	mux.Handle(grpchealth.NewHandler(&healthChecker{ready: ready, flight: &singleflight.Group{}}, opts...))
	mux.Handle(grpcreflect.NewHandlerV1(reflector, opts...))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, opts...))
	return nil
}

// openFiles is what reflection serves: the door's proto files with their
// imports, and grpc.health.v1's.
func openFiles() (*protoregistry.Files, error) {
	files := new(protoregistry.Files)
	var add func(fd protoreflect.FileDescriptor) error
	add = func(fd protoreflect.FileDescriptor) error {
		if _, err := files.FindFileByPath(fd.Path()); err == nil {
			return nil
		}
		imports := fd.Imports()
		for i := range imports.Len() {
			if err := add(imports.Get(i).FileDescriptor); err != nil {
				return err
			}
		}
		return files.RegisterFile(fd)
	}
	health, err := protodesc.NewFile(healthProto(), files)
	if err != nil {
		return nil, fmt.Errorf("door: grpc.health.v1 descriptor: %w", err)
	}
	for _, fd := range []protoreflect.FileDescriptor{runnerv1.File_compass_runner_v1_runner_proto, adminv1.File_compass_admin_v1_admin_proto, health} {
		if err := add(fd); err != nil {
			return nil, fmt.Errorf("door: reflection descriptors: %w", err)
		}
	}
	return files, nil
}

// healthProto describes grpc.health.v1 as connect's grpchealth serves it
// (grpc/health/v1/health.proto less the List RPC, which it does not serve).
// connect registers its copy under another package name, so that it never
// clashes with grpc-go's; grpc-go's own is not linked into compass-server.
// It is kept here, out of the global registry, for the same reason;
// TestHealthDescriptorIsGRPCs compares it with grpc-go's.
func healthProto() *descriptorpb.FileDescriptorProto {
	str := func(s string) *string { return &s }
	field := func(name string, typ descriptorpb.FieldDescriptorProto_Type, typeName string) *descriptorpb.FieldDescriptorProto {
		f := &descriptorpb.FieldDescriptorProto{Name: str(name), JsonName: str(name), Number: proto.Int32(1),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: typ.Enum()}
		if typeName != "" {
			f.TypeName = str(typeName)
		}
		return f
	}
	value := func(name string, n int32) *descriptorpb.EnumValueDescriptorProto {
		return &descriptorpb.EnumValueDescriptorProto{Name: str(name), Number: proto.Int32(n)}
	}
	return &descriptorpb.FileDescriptorProto{
		Name:    str("grpc/health/v1/health.proto"),
		Package: str("grpc.health.v1"),
		Syntax:  str("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: str("HealthCheckRequest"), Field: []*descriptorpb.FieldDescriptorProto{
				field("service", descriptorpb.FieldDescriptorProto_TYPE_STRING, "")}},
			{Name: str("HealthCheckResponse"), Field: []*descriptorpb.FieldDescriptorProto{
				field("status", descriptorpb.FieldDescriptorProto_TYPE_ENUM, ".grpc.health.v1.HealthCheckResponse.ServingStatus")},
				EnumType: []*descriptorpb.EnumDescriptorProto{{Name: str("ServingStatus"), Value: []*descriptorpb.EnumValueDescriptorProto{
					value("UNKNOWN", 0), value("SERVING", 1), value("NOT_SERVING", 2), value("SERVICE_UNKNOWN", 3)}}}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: str("Health"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: str("Check"), InputType: str(".grpc.health.v1.HealthCheckRequest"), OutputType: str(".grpc.health.v1.HealthCheckResponse")},
			{Name: str("Watch"), InputType: str(".grpc.health.v1.HealthCheckRequest"), OutputType: str(".grpc.health.v1.HealthCheckResponse"),
				ServerStreaming: proto.Bool(true)},
		}}},
		Options: &descriptorpb.FileOptions{GoPackage: str("google.golang.org/grpc/health/grpc_health_v1")},
	}
}
