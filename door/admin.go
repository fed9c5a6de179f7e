package door

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/verifier"
)

// PingTimeout bounds one PingRunner round trip. A connected Runner answers
// ping in microseconds plus two network hops; five seconds leaves room for a
// slow link without leaving an operator waiting on a Runner that is gone.
const PingTimeout = 5 * time.Second

// PingRequest is the body PingRunner sends: the Runner's command envelope.
var PingRequest = []byte(`{"command":"ping"}`)

// RunnerLister lists the Runner registry. store.Store satisfies it.
type RunnerLister interface {
	ListRunners(ctx context.Context) ([]store.Runner, error)
}

// QuarantineLister lists the quarantined Runner IDs (store.Store has it).
type QuarantineLister interface {
	ListQuarantined(ctx context.Context) ([]store.Quarantine, error)
}

// Requester sends a NATS request and returns the reply's payload. NATSRequester
// adapts a *nats.Conn. It returns an error wrapping ErrNoResponders when no
// one subscribes to the subject.
type Requester interface {
	Request(ctx context.Context, subject string, data []byte) ([]byte, error)
}

// ErrNoResponders means nobody serves the subject: the Runner is not connected.
var ErrNoResponders = errors.New("door: no responders")

// AdminService implements compass.admin.v1.AdminService.
type AdminService struct {
	adminv1connect.UnimplementedAdminServiceHandler

	runners     RunnerLister
	quarantined QuarantineLister // nil: none listed
	requester   Requester        // nil: no NATS connection
	now         func() time.Time
	log         *slog.Logger
}

func (s *AdminService) account(ctx context.Context) (verifier.Subject, error) {
	subj, ok := SubjectFrom(ctx)
	if !ok || subj.Kind != verifier.SubjectAccount {
		return verifier.Subject{}, connect.NewError(connect.CodeUnauthenticated, errors.New(msgUnauthenticated))
	}
	return subj, nil
}

// ListRunners returns the Runner registry.
func (s *AdminService) ListRunners(ctx context.Context, _ *connect.Request[adminv1.ListRunnersRequest]) (*connect.Response[adminv1.ListRunnersResponse], error) {
	if _, err := s.account(ctx); err != nil {
		return nil, err
	}
	rs, err := s.runners.ListRunners(ctx)
	if err != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "door: list runners failed", slog.String("err", err.Error()))
		return nil, connect.NewError(connect.CodeInternal, errors.New("listing runners failed"))
	}
	out := &adminv1.ListRunnersResponse{Runners: make([]*adminv1.Runner, 0, len(rs))}
	for _, r := range rs {
		out.Runners = append(out.Runners, RunnerToProto(r))
	}
	if s.quarantined != nil {
		qs, err := s.quarantined.ListQuarantined(ctx)
		if err != nil {
			s.log.LogAttrs(ctx, slog.LevelError, "door: list quarantined runner IDs failed", slog.String("err", err.Error()))
			return nil, connect.NewError(connect.CodeInternal, errors.New("listing runners failed"))
		}
		for _, q := range qs {
			out.Quarantined = append(out.Quarantined, QuarantineToProto(q))
		}
	}
	return connect.NewResponse(out), nil
}

// QuarantineToProto converts a quarantine record.
func QuarantineToProto(q store.Quarantine) *adminv1.Quarantine {
	return &adminv1.Quarantine{RunnerId: q.RunnerID, QuarantinedAt: timestamppb.New(q.QuarantinedAt),
		Displacements: int32(min(q.Displacements, math.MaxInt32)), NewerClient: q.NewerClient, OlderClient: q.OlderClient}
}

// RunnerToProto converts a registry row; zero times stay unset.
func RunnerToProto(r store.Runner) *adminv1.Runner {
	ts := func(t time.Time) *timestamppb.Timestamp {
		if t.IsZero() {
			return nil
		}
		return timestamppb.New(t)
	}
	return &adminv1.Runner{
		Id: r.ID, Method: r.Method, Cluster: r.Cluster,
		NodeName: r.NodeName, NodeUid: r.NodeUID, PodName: r.PodName, PodUid: r.PodUID,
		Version: r.Version, Hostname: r.Hostname,
		FirstEnrolled: ts(r.FirstEnrolledAt), LastEnrolled: ts(r.LastEnrolledAt), LastSeen: ts(r.LastSeenAt),
	}
}

// PingRunner sends {"command":"ping"} to the Runner's command subject and
// returns its answer and the round-trip time.
func (s *AdminService) PingRunner(ctx context.Context, req *connect.Request[adminv1.PingRunnerRequest]) (*connect.Response[adminv1.PingRunnerResponse], error) {
	acct, err := s.account(ctx)
	if err != nil {
		return nil, err
	}
	id := req.Msg.GetRunnerId()
	subject, err := subjects.Command(id)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("runner_id %q: %w", id, err))
	}
	if s.requester == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the Server has no NATS connection (start it with --nats-url)"))
	}
	ctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	start := s.now()
	data, err := s.requester.Request(ctx, subject, PingRequest)
	rtt := s.now().Sub(start)
	log := s.log.With("runner_id", id, "account", acct.ID)
	switch {
	case errors.Is(err, ErrNoResponders):
		log.InfoContext(ctx, "door: ping: runner not connected")
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("runner %q is not connected to NATS", id))
	case errors.Is(err, context.DeadlineExceeded):
		log.InfoContext(ctx, "door: ping: no answer", "timeout", PingTimeout)
		return nil, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("runner %q did not answer within %s", id, PingTimeout))
	case err != nil:
		log.WarnContext(ctx, "door: ping failed", "err", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the NATS request failed"))
	}
	if !json.Valid(data) {
		log.WarnContext(ctx, "door: ping: the answer is not JSON", "bytes", len(data))
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("runner %q answered with something that is not JSON", id))
	}
	log.InfoContext(ctx, "door: ping answered", "rtt", rtt)
	return connect.NewResponse(&adminv1.PingRunnerResponse{AnswerJson: string(data), Rtt: durationpb.New(rtt)}), nil
}
