// Package door is compass-server's gRPC door: connect-go handlers for
// compass.runner.v1.RunnerService (Runners) and compass.admin.v1.AdminService
// (operators), behind a bearer interceptor that calls the shared verifier with
// the kind of subject each service wants. It speaks gRPC, gRPC-Web and Connect
// over TLS only.
package door

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"connectrpc.com/connect"

	"github.com/compass-runner/identity/verifier"
)

// Resolver authenticates a presented token for a door that wants subjects of
// kind want. *verifier.Resolver satisfies it.
type Resolver interface {
	Resolve(ctx context.Context, token string, want verifier.SubjectKind) (verifier.Subject, error)
}

// The messages a caller sees when authentication fails. They are fixed: the
// cause (which names the cluster, never the token) goes to the log only.
const (
	msgUnauthenticated = "unauthenticated"
	msgUnavailable     = "runner cluster keys unavailable; retry later"
)

type subjectKey struct{}

// SubjectFrom returns the subject the bearer interceptor authenticated.
func SubjectFrom(ctx context.Context) (verifier.Subject, bool) {
	s, ok := ctx.Value(subjectKey{}).(verifier.Subject)
	return s, ok
}

// WithSubject returns ctx carrying s, as the interceptor does.
func WithSubject(ctx context.Context, s verifier.Subject) context.Context {
	return context.WithValue(ctx, subjectKey{}, s)
}

// BearerAuth is a connect.Interceptor that authenticates every call on the
// handler side with "authorization: Bearer <token>". A unary call
// authenticates before its handler runs; a stream authenticates once, when it
// opens (DL-440 §Revocation: a stream outlives its token). On the client side
// it does nothing.
type BearerAuth struct {
	resolver Resolver
	want     verifier.SubjectKind
	log      *slog.Logger
	onResult func(want verifier.SubjectKind, code connect.Code)
}

// NewBearerAuth returns the interceptor for a service that wants subjects of
// kind want. onResult, if set, is called after every authentication with the
// resulting code (0 for success), for metrics; it must not block.
func NewBearerAuth(r Resolver, want verifier.SubjectKind, log *slog.Logger, onResult func(verifier.SubjectKind, connect.Code)) *BearerAuth {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &BearerAuth{resolver: r, want: want, log: log, onResult: onResult}
}

var errNoBearer = errors.New("door: no bearer token in the authorization header")

// bearerToken extracts the token of an "authorization: Bearer <token>" header.
// The scheme is case-insensitive (RFC 9110 §11.1).
func bearerToken(h string) (string, error) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", errNoBearer
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", errNoBearer
	}
	return tok, nil
}

// authenticate resolves the call's bearer token and returns ctx carrying the
// subject, or a connect error: CodeUnavailable for ErrKeysUnavailable,
// CodeUnauthenticated with a fixed message for anything else.
func (a *BearerAuth) authenticate(ctx context.Context, procedure, peer, header string) (context.Context, error) {
	tok, err := bearerToken(header)
	var subj verifier.Subject
	if err == nil {
		subj, err = a.resolver.Resolve(ctx, tok, a.want)
	}
	if err == nil && subj.Kind != a.want {
		// Resolve never returns another kind; refuse rather than trust it.
		err = verifier.ErrWrongKind
	}
	if err != nil {
		code := connect.CodeUnauthenticated
		msg := msgUnauthenticated
		if errors.Is(err, verifier.ErrKeysUnavailable) {
			code, msg = connect.CodeUnavailable, msgUnavailable
		}
		// err comes from the verifier (fixed causes and cluster names) or is
		// errNoBearer: it never holds the token.
		a.log.LogAttrs(ctx, slog.LevelWarn, "door: authentication failed",
			slog.String("procedure", procedure), slog.String("peer", peer),
			slog.String("want", a.want.String()), slog.String("cluster", verifier.ClusterOf(err)),
			slog.String("code", code.String()), slog.String("err", err.Error()))
		if a.onResult != nil {
			a.onResult(a.want, code)
		}
		return ctx, connect.NewError(code, errors.New(msg))
	}
	if a.onResult != nil {
		a.onResult(a.want, 0)
	}
	return WithSubject(ctx, subj), nil
}

// WrapUnary implements connect.Interceptor.
func (a *BearerAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := a.authenticate(ctx, req.Spec().Procedure, req.Peer().Addr, req.Header().Get("Authorization"))
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor; clients pass through.
func (a *BearerAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler implements connect.Interceptor: a stream authenticates
// when it opens, before the handler reads its first message.
func (a *BearerAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.authenticate(ctx, conn.Spec().Procedure, conn.Peer().Addr, conn.RequestHeader().Get("Authorization"))
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
