package door

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/verifier"
)

// Limits of the door, each with its reason.
const (
	// MaxRequestBytes caps a request message. Enroll and the admin requests
	// carry a few short strings; nothing legitimate comes near it.
	MaxRequestBytes = 64 << 10
	// MaxHeaderBytes caps request headers: a bearer token is at most
	// verifier.MaxTokenBytes (16 KiB), and the rest of a gRPC request's
	// headers are small.
	MaxHeaderBytes = 64 << 10
	// ReadHeaderTimeout bounds a client's headers, so a slow client cannot
	// hold a connection open without sending a request.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout closes keep-alive connections nobody uses.
	IdleTimeout = 5 * time.Minute
	// ShutdownTimeout bounds the graceful stop: unary calls finish in well
	// under a second (a ping is bounded by PingTimeout).
	ShutdownTimeout = 10 * time.Second
)

// Config is what the door needs.
type Config struct {
	// Resolver authenticates bearer tokens (*verifier.Resolver).
	Resolver Resolver
	// Enroller records enrollments and Runners lists them (store.Store).
	Enroller Enroller
	Runners  RunnerLister
	// Quarantines, if set, refuses Enroll for a quarantined Runner ID and
	// lists the quarantined IDs in ListRunners (store.Store; DL-459).
	Quarantines Quarantines
	// Requester sends PingRunner's NATS request; nil answers Unavailable.
	Requester Requester
	// NATSURL is what EnrollResponse tells Runners to connect to.
	NATSURL string
	// ServerVersion is EnrollResponse.server_version.
	ServerVersion string
	// Logger gets the door's logs (default: discard).
	Logger *slog.Logger
	// Metrics registers the door's metrics (nil: a private registry).
	Metrics prometheus.Registerer
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Ready reports why the door cannot serve (the store, the certificate),
	// or nil; grpc.health.v1 answers NOT_SERVING while it fails. nil:
	// SERVING while the door answers.
	Ready func(ctx context.Context) error
}

// Metric names.
const (
	MetricNodeRebuilt = "compass_runner_node_rebuilt_total"
	MetricAuth        = "compass_door_auth_total"
)

// NewHandler returns the door's HTTP handler: RunnerService wants Runner
// subjects, AdminService account subjects; grpc.health.v1.Health and server
// reflection (v1, v1alpha) want none (handleOpen). Serve it over TLS only
// (ServeTLS).
func NewHandler(cfg Config) (http.Handler, error) {
	if cfg.Resolver == nil || cfg.Enroller == nil || cfg.Runners == nil {
		return nil, errors.New("door: Resolver, Enroller and Runners are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	rebuilt := prometheus.NewCounter(prometheus.CounterOpts{
		Name: MetricNodeRebuilt,
		Help: "Enrollments whose node uid differed from the previous enrollment of the same Runner ID (a node rebuilt with the same name).",
	})
	auth := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricAuth,
		Help: "Bearer authentications at the door, by wanted subject kind and result code (ok, unauthenticated, unavailable).",
	}, []string{"want", "code"})
	for _, c := range []prometheus.Collector{rebuilt, auth} {
		if err := cfg.Metrics.Register(c); err != nil {
			return nil, fmt.Errorf("door: register metrics: %w", err)
		}
	}
	onResult := func(want verifier.SubjectKind, code connect.Code) {
		label := "ok"
		if code != 0 {
			label = code.String()
		}
		auth.WithLabelValues(want.String(), label).Inc()
	}
	rpc, err := newRPCMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("door: register metrics: %w", err)
	}
	// The call metrics first: the outermost interceptor sees every handled
	// call's final code, the authentication's refusals included.
	common := []connect.HandlerOption{connect.WithReadMaxBytes(MaxRequestBytes), connect.WithInterceptors(rpc)}

	mux := http.NewServeMux()
	rs := &RunnerService{enroller: cfg.Enroller, quarantines: cfg.Quarantines, natsURL: cfg.NATSURL, serverVersion: cfg.ServerVersion,
		log: cfg.Logger, nodeRebuilt: rebuilt}
	path, h := runnerv1connect.NewRunnerServiceHandler(rs, append(common,
		connect.WithInterceptors(NewBearerAuth(cfg.Resolver, verifier.SubjectRunner, cfg.Logger, onResult)))...)
	mux.Handle(path, h)
	as := &AdminService{runners: cfg.Runners, quarantined: cfg.Quarantines, requester: cfg.Requester, now: cfg.Now, log: cfg.Logger}
	path, h = adminv1connect.NewAdminServiceHandler(as, append(common,
		connect.WithInterceptors(NewBearerAuth(cfg.Resolver, verifier.SubjectAccount, cfg.Logger, onResult)))...)
	mux.Handle(path, h)
	if err := handleOpen(mux, cfg.Ready, common...); err != nil {
		return nil, err
	}
	// Outside the mux: what it and Connect refuse before the call metrics
	// see a request is counted apart (compass_door_rejected_requests_total).
	rejected, err := newRejectedMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("door: register metrics: %w", err)
	}
	return rejected.wrap(mux), nil
}

// NewServer returns an http.Server for the door with its limits set. tlsConfig
// must carry the serving certificate; HTTP/2 is negotiated over TLS by ALPN.
func NewServer(h http.Handler, tlsConfig *tls.Config, log *slog.Logger) *http.Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tc := tlsConfig.Clone()
	if tc.MinVersion < tls.VersionTLS12 {
		tc.MinVersion = tls.VersionTLS12
	}
	return &http.Server{
		Handler:           h,
		TLSConfig:         tc,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// ServeTLS serves srv on ln over TLS until ctx ends, then shuts down
// gracefully (at most ShutdownTimeout). It returns nil after a shutdown that
// ctx asked for, or the serve error.
func ServeTLS(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("door: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("door: serve: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("door: shutdown: %w", err)
	}
	return nil
}

// NATSRequester adapts a NATS connection to Requester.
type NATSRequester struct{ Conn *nats.Conn }

// Request sends data to subject and waits for one reply until ctx ends.
func (r NATSRequester) Request(ctx context.Context, subject string, data []byte) ([]byte, error) {
	msg, err := r.Conn.RequestWithContext(ctx, subject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("%w: %s", ErrNoResponders, subject)
	}
	if err != nil {
		return nil, fmt.Errorf("door: nats request: %w", err)
	}
	return msg.Data, nil
}
