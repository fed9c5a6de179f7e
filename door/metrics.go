package door

import (
	"context"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
)

// Metric names of the door's calls.
const (
	MetricRequests        = "compass_door_requests_total"
	MetricRequestDuration = "compass_door_request_duration_seconds"
)

// rpcMetrics is a Connect interceptor that counts every call the door
// handles by service, method and status code, and times it by service and
// method. It is the outermost interceptor, so a call the bearer
// authentication refuses is counted with its code (unauthenticated,
// unavailable) like any other. A request Connect refuses before any
// interceptor runs (an unknown path, a body over MaxRequestBytes, a bad
// content type) is not counted here, no method was called: rejectedMetrics
// counts it, from the mark markSeen leaves for every call counted here.
//
// The labels come from the handlers' own procedures, never from the request,
// so a client cannot grow the label set.
type rpcMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// knownProcedures are created at zero (ok, and a latency histogram), so
// the families are in /metrics, and a rate is defined, before the first call.
var knownProcedures = []string{
	runnerv1connect.RunnerServiceEnrollProcedure,
	adminv1connect.AdminServiceListRunnersProcedure,
	adminv1connect.AdminServicePingRunnerProcedure,
}

func newRPCMetrics(reg prometheus.Registerer) (*rpcMetrics, error) {
	m := &rpcMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricRequests,
			Help: "Calls the door handled, by service, method and status code (ok, or the gRPC code: unauthenticated, permission_denied, unavailable, internal, ...).",
		}, []string{"service", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricRequestDuration,
			Help: "Time the door took to handle a call, from its request decoded to its answer, by service and method.",
			// 1 ms to ~16 s: an Enroll from the verified-token cache takes
			// under a millisecond, one that fetches a key set up to its
			// timeout, and PingRunner waits for the Runner's answer.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"service", "method"}),
	}
	for _, p := range knownProcedures {
		svc, method := splitProcedure(p)
		m.requests.WithLabelValues(svc, method, "ok")
		m.duration.WithLabelValues(svc, method)
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// splitProcedure splits "/package.Service/Method".
func splitProcedure(p string) (service, method string) {
	p = strings.TrimPrefix(p, "/")
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return p, ""
}

func (m *rpcMetrics) observe(procedure string, err error, took time.Duration) {
	svc, method := splitProcedure(procedure)
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
	}
	m.requests.WithLabelValues(svc, method, code).Inc()
	m.duration.WithLabelValues(svc, method).Observe(took.Seconds())
}

func (m *rpcMetrics) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		markSeen(ctx)
		start := time.Now()
		resp, err := next(ctx, req)
		m.observe(req.Spec().Procedure, err, time.Since(start))
		return resp, err
	}
}

func (m *rpcMetrics) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (m *rpcMetrics) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		markSeen(ctx)
		start := time.Now()
		err := next(ctx, conn)
		m.observe(conn.Spec().Procedure, err, time.Since(start))
		return err
	}
}
