package door_test

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/compass-runner/identity/door"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

const (
	runnerService = "compass.runner.v1.RunnerService"
	adminService  = "compass.admin.v1.AdminService"
)

// calls returns compass_door_requests_total by "service/method code", and
// the number of observations of compass_door_request_duration_seconds by
// "service/method".
func calls(t *testing.T, reg *prometheus.Registry) (requests map[string]float64, timed map[string]uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	requests, timed = map[string]float64{}, map[string]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetName() {
			case door.MetricRequests:
				requests[l["service"]+"/"+l["method"]+" "+l["code"]] = m.GetCounter().GetValue()
			case door.MetricRequestDuration:
				timed[l["service"]+"/"+l["method"]] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	return requests, timed
}

// Every call the door handles is counted by service, method and status
// code, and timed by method: successes, the bearer authentication's
// refusals (the interceptor is outermost), a handler's own errors, and the
// health check and reflection (a stream). The three business methods are in
// /metrics at zero before any call.
func TestDoorCountsEveryCallByMethodAndCode(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	requests, timed := calls(t, h.reg)
	for _, k := range []string{runnerService + "/Enroll", adminService + "/ListRunners", adminService + "/PingRunner"} {
		if v, ok := requests[k+" ok"]; !ok || v != 0 {
			t.Errorf("%s ok before any call: %v (present %v), want 0", k, v, ok)
		}
		if n, ok := timed[k]; !ok || n != 0 {
			t.Errorf("%s timed before any call: %v (present %v), want 0", k, n, ok)
		}
	}

	good := h.projected(t, h.prod, kubeissuer.Pod{NodeName: "node-m"})
	for range 2 {
		if _, err := h.enroll(t, good, ""); err != nil {
			t.Fatal(err)
		}
	}
	_, err := h.enroll(t, h.projected(t, h.dark, kubeissuer.Pod{NodeName: "node-m"}), "")
	wantCode(t, err, connect.CodeUnavailable, "")
	_, err = h.enroll(t, "", "")
	wantCode(t, err, connect.CodeUnauthenticated, "")
	_, err = h.enroll(t, good, "someone-else")
	wantCode(t, err, connect.CodePermissionDenied, "")
	ops := h.mint(t, verifier.SubjectAccount, "ops")
	if _, err := h.adminClient().ListRunners(t.Context(), bearer(&adminv1.ListRunnersRequest{}, ops)); err != nil {
		t.Fatal(err)
	}
	_, err = h.adminClient().ListRunners(t.Context(), bearer(&adminv1.ListRunnersRequest{}, good))
	wantCode(t, err, connect.CodeUnauthenticated, "")
	_, err = h.adminClient().PingRunner(t.Context(), bearer(&adminv1.PingRunnerRequest{RunnerId: "r1"}, ops))
	wantCode(t, err, connect.CodeUnavailable, "") // no NATS
	cc := h.grpcConn(t)
	if _, err := healthv1.NewHealthClient(cc).Check(t.Context(), &healthv1.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if len(listServices(t, cc, false)) == 0 {
		t.Fatal("reflection lists no service")
	}

	// A stream is counted when its handler returns: this client reads its
	// answer and cancels the stream.
	testutil.Eventually(t, 10*time.Second, "the reflection stream counted", func() bool {
		requests, _ := calls(t, h.reg)
		return requests["grpc.reflection.v1.ServerReflection/ServerReflectionInfo canceled"] == 1
	})
	requests, timed = calls(t, h.reg)
	want := map[string]float64{
		runnerService + "/Enroll ok":                                        2,
		runnerService + "/Enroll unavailable":                               1,
		runnerService + "/Enroll unauthenticated":                           1,
		runnerService + "/Enroll permission_denied":                         1,
		adminService + "/ListRunners ok":                                    1,
		adminService + "/ListRunners unauthenticated":                       1,
		adminService + "/PingRunner ok":                                     0,
		adminService + "/PingRunner unavailable":                            1,
		"grpc.health.v1.Health/Check ok":                                    1,
		"grpc.reflection.v1.ServerReflection/ServerReflectionInfo canceled": 1,
	}
	if len(requests) != len(want) {
		t.Errorf("counted %v, want %v", requests, want)
	}
	for k, v := range want {
		if requests[k] != v {
			t.Errorf("%s = %v, want %v", k, requests[k], v)
		}
	}
	for k, n := range map[string]uint64{runnerService + "/Enroll": 5, adminService + "/ListRunners": 2, adminService + "/PingRunner": 1} {
		if timed[k] != n {
			t.Errorf("%s timed %d times, want %d", k, timed[k], n)
		}
	}
}
