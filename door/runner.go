package door

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// MaxClientStringLen bounds the strings a Runner sends at enrollment
// (runner_id, version, hostname). They are logged and the last two stored; a
// Runner ID is at most store.MaxRunnerIDLen (294) bytes, a host name 253, a
// version far less.
const MaxClientStringLen = store.MaxReportedLen

// Enroller records an enrollment. store.Store satisfies it.
type Enroller interface {
	RecordEnrollment(ctx context.Context, e store.Enrollment) (store.EnrollResult, error)
}

// QuarantineReader reads a Runner ID's displacement record (store.Store
// has it): Enroll refuses a quarantined ID.
type QuarantineReader interface {
	GetQuarantine(ctx context.Context, runnerID string) (store.Quarantine, error)
}

// Quarantines is what the door reads of the quarantine: the Runner door one
// ID's record, the admin door the list (store.Store has both).
type Quarantines interface {
	QuarantineReader
	QuarantineLister
}

// RunnerService implements compass.runner.v1.RunnerService.
type RunnerService struct {
	runnerv1connect.UnimplementedRunnerServiceHandler

	enroller      Enroller
	quarantines   QuarantineReader // nil: none
	natsURL       string
	serverVersion string
	log           *slog.Logger
	nodeRebuilt   prometheus.Counter
}

// Enroll records the Runner the token speaks for and answers with the
// Server-assigned Runner ID and the NATS URL to use. An empty request
// runner_id is accepted; a non-empty one must equal the assigned ID.
func (s *RunnerService) Enroll(ctx context.Context, req *connect.Request[runnerv1.EnrollRequest]) (*connect.Response[runnerv1.EnrollResponse], error) {
	subj, ok := SubjectFrom(ctx)
	if !ok || subj.Kind != verifier.SubjectRunner {
		// The interceptor is missing: never serve an unauthenticated call.
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New(msgUnauthenticated))
	}
	m := req.Msg
	if len(m.GetRunnerId()) > MaxClientStringLen || len(m.GetVersion()) > MaxClientStringLen || len(m.GetHostname()) > MaxClientStringLen {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("runner_id, version and hostname may be at most %d bytes each", MaxClientStringLen))
	}
	for _, f := range []struct{ name, v string }{{"version", m.GetVersion()}, {"hostname", m.GetHostname()}} {
		if err := store.CheckReported(f.v); err != nil {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s: %w", f.name, err))
		}
	}
	if id := m.GetRunnerId(); id != "" && id != subj.ID {
		s.log.LogAttrs(ctx, slog.LevelWarn, "door: enroll: requested runner ID is not the token's",
			slog.String("runner_id", subj.ID), slog.String("requested", id), slog.String("method", subj.Method()))
		return nil, connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("runner_id %q does not match the Runner ID this token speaks for; send an empty runner_id to be told it", id))
	}
	if err := s.checkQuarantine(ctx, subj); err != nil {
		return nil, err
	}
	e := store.Enrollment{RunnerID: subj.ID, Method: subj.Method(), Version: m.GetVersion(), Hostname: m.GetHostname()}
	if w := subj.Workload; w != nil {
		e.Cluster, e.NodeName, e.NodeUID, e.PodName, e.PodUID = w.Cluster, w.NodeName, w.NodeUID, w.PodName, w.PodUID
	}
	res, err := s.enroller.RecordEnrollment(ctx, e)
	if err != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "door: enroll: recording the Runner failed",
			slog.String("runner_id", subj.ID), slog.String("err", err.Error()))
		return nil, connect.NewError(connect.CodeInternal, errors.New("recording the enrollment failed"))
	}
	attrs := []slog.Attr{slog.String("runner_id", subj.ID), slog.String("method", subj.Method()),
		slog.String("version", m.GetVersion()), slog.String("hostname", m.GetHostname()),
		slog.Bool("first", res.FirstEnrollment)}
	if w := subj.Workload; w != nil {
		attrs = append(attrs, slog.String("cluster", w.Cluster), slog.String("node", w.NodeName), slog.String("pod", w.PodName))
	}
	if res.NodeUIDChanged {
		s.nodeRebuilt.Inc()
		s.log.LogAttrs(ctx, slog.LevelWarn, "door: enroll: node uid changed under the same Runner ID (the node was rebuilt with the same name)",
			append(attrs, slog.String("previous_node_uid", res.PreviousNodeUID), slog.String("node_uid", e.NodeUID))...)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "door: runner enrolled", attrs...)
	return connect.NewResponse(&runnerv1.EnrollResponse{
		ServerVersion: s.serverVersion,
		RunnerId:      subj.ID,
		NatsUrl:       s.natsURL,
	}), nil
}

// checkQuarantine refuses a quarantined Runner ID (DL-459) with the door's
// one authentication failure, as it refuses a revoked token: the caller
// holds a token that speaks for the ID, so a different answer would tell a
// copy's holder that it was caught. The cause goes to the log.
func (s *RunnerService) checkQuarantine(ctx context.Context, subj verifier.Subject) error {
	if s.quarantines == nil {
		return nil
	}
	q, err := s.quarantines.GetQuarantine(ctx, subj.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		s.log.LogAttrs(ctx, slog.LevelError, "door: enroll: reading the Runner's quarantine failed",
			slog.String("runner_id", subj.ID), slog.String("err", err.Error()))
		return connect.NewError(connect.CodeInternal, errors.New("checking the enrollment failed"))
	case !q.Quarantined():
		return nil
	}
	s.log.LogAttrs(ctx, slog.LevelWarn, "door: enroll: runner ID quarantined (a copied token); refused until compass-server clear-quarantine",
		slog.String("runner_id", subj.ID), slog.String("method", subj.Method()), slog.Time("since", q.QuarantinedAt),
		slog.String("newer_client", q.NewerClient), slog.String("older_client", q.OlderClient))
	return connect.NewError(connect.CodeUnauthenticated, errors.New(msgUnauthenticated))
}
