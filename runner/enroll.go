package runner

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/compass-runner/identity/internal/lib/doorhttp"
)

// Enrollment limits, each with its reason.
const (
	// EnrollAttemptTimeout bounds one Enroll attempt (DL-440's
	// enrollAttemptTimeout): the Server's discovery plus JWKS fetch (3 s) fits
	// inside it, and a hung Server does not stall the retry loop.
	EnrollAttemptTimeout = 10 * time.Second
	// DefaultRetryBase and DefaultRetryMax shape the backoff for Unavailable
	// (an issuer outage or a Server rollout): quick first retries, then at
	// most one attempt per 30 s per Runner, with full jitter so a fleet that
	// lost the Server together does not come back in waves.
	DefaultRetryBase = 500 * time.Millisecond
	DefaultRetryMax  = 30 * time.Second
)

// NewBearerInterceptor authenticates every client call with the token
// source's current token ("authorization: Bearer <token>"). A unary call whose
// source fails returns that error without calling the Server; a streaming
// call is opened without the header (the Server answers Unauthenticated) and
// the failure is logged.
func NewBearerInterceptor(src TokenSource, log *slog.Logger) connect.Interceptor {
	if log == nil {
		log = slog.Default()
	}
	return &bearer{src: src, log: log}
}

type bearer struct {
	src TokenSource
	log *slog.Logger
}

func (b *bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			tok, err := b.src.Token()
			if err != nil {
				return nil, fmt.Errorf("runner: bearer token for %s: %w", req.Spec().Procedure, err)
			}
			req.Header().Set("Authorization", "Bearer "+tok)
		}
		return next(ctx, req)
	}
}

func (b *bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		tok, err := b.src.Token()
		if err != nil {
			b.log.Error("runner: no token for stream; opening it unauthenticated", "procedure", spec.Procedure, "err", err)
			return conn
		}
		conn.RequestHeader().Set("Authorization", "Bearer "+tok)
		return conn
	}
}

func (b *bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Retry retries a call while the Server answers Unavailable, with capped,
// fully jittered exponential backoff; each attempt is bounded.
type Retry struct {
	AttemptTimeout time.Duration // EnrollAttemptTimeout when zero
	Base, Max      time.Duration // DefaultRetryBase, DefaultRetryMax when zero
	// Jitter draws uniformly from [0, d) (default math/rand/v2).
	Jitter func(d time.Duration) time.Duration
	// After is the timer (default time.After); tests pass their own.
	After  func(d time.Duration) <-chan time.Time
	Logger *slog.Logger
	// OnAttempt, if set, is told each attempt's result (nil: it succeeded):
	// Metrics.ObserveEnroll.
	OnAttempt func(err error)
}

// Retryable reports whether err is worth another attempt: the Server (or the
// path to it) is Unavailable, or the attempt ran out of its own time while the
// caller's context is still live.
func Retryable(ctx context.Context, err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable:
		return true
	case connect.CodeDeadlineExceeded:
		return ctx.Err() == nil
	}
	return false
}

// Do calls attempt until it succeeds, fails with a non-retryable error, or
// ctx ends. It returns the last error.
func (r Retry) Do(ctx context.Context, what string, attempt func(ctx context.Context) error) error {
	if r.AttemptTimeout <= 0 {
		r.AttemptTimeout = EnrollAttemptTimeout
	}
	if r.Base <= 0 {
		r.Base = DefaultRetryBase
	}
	if r.Max <= 0 {
		r.Max = DefaultRetryMax
	}
	if r.Jitter == nil {
		r.Jitter = func(d time.Duration) time.Duration {
			if d <= 0 {
				return 0
			}
			return time.Duration(rand.Int64N(int64(d)))
		}
	}
	if r.After == nil {
		r.After = time.After
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	ceiling := r.Base
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, r.AttemptTimeout)
		err := attempt(actx)
		cancel()
		if r.OnAttempt != nil {
			r.OnAttempt(err)
		}
		if err == nil {
			return nil
		}
		if !Retryable(ctx, err) {
			return err
		}
		wait := r.Jitter(ceiling)
		r.Logger.Warn("runner: Server unavailable; retrying", "call", what, "attempt", n, "err", err, "retry_in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
		case <-r.After(wait):
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		}
		ceiling = min(ceiling*2, r.Max)
	}
}

// DoorHTTPClient is the HTTP client for the Server's door: HTTPS only (the
// Runner sends its token on every call), HTTP/2 for gRPC, trusting the system
// roots plus caFile when set.
func DoorHTTPClient(serverURL, caFile string) (*http.Client, error) {
	hc, err := doorhttp.Client(serverURL, caFile)
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	return hc, nil
}
