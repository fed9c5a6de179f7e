package callout

// The decision: one request's steps from payload to answer, the token
// resolved through the shared verifier, and what is logged about it.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/compass-runner/identity/verifier"
	"github.com/nats-io/jwt/v2"
)

// request is a checked authorization request.
type request struct {
	claims    *jwt.AuthorizationRequestClaims
	serverKey string // server xkey to seal the answer to; "" when plain
	keys      keyGen // the keys this request's server expects (rotation.go)
	exp       time.Time
	arrived   time.Time
	// resolveBy is when the resolver must be done: the request's deadline
	// (the earlier of exp and arrival plus the horizon) less answerReserve.
	resolveBy time.Time
}

// decide answers one delivered request, or drops it.
func (r *Responder) decide(ctx context.Context, j job) Event {
	m := j.m
	if m.Reply == "" {
		return Event{Outcome: OutcomeDropped, Reason: DropNoReply}
	}
	resp, ev := r.answer(ctx, j.arrived, m.Header.Get(XKeyHeader), m.Data)
	if resp == nil {
		return ev
	}
	if err := m.Respond(resp); err != nil {
		return Event{Outcome: OutcomeError, Reason: fmt.Sprintf("callout: publish response: %v", err),
			Cluster: ev.Cluster, UserNkey: ev.UserNkey, Sealed: ev.Sealed}
	}
	r.age(&ev, j.arrived) // published now
	return ev
}

// age records how long after its arrival a request was answered.
func (r *Responder) age(ev *Event, arrived time.Time) {
	ev.Age = r.cfg.Now().Sub(arrived)
	ev.PastHorizon = ev.Age > r.cfg.AnswerHorizon
}

// Answer runs the per-request steps on a request's payload and its
// Nats-Server-Xkey header value ("" when absent), as for a request arriving
// now. It returns the response payload to publish, or nil when the request
// is dropped (Event says why). It does no I/O other than the resolver's.
func (r *Responder) Answer(ctx context.Context, serverXKey string, data []byte) ([]byte, Event) {
	return r.answer(ctx, r.cfg.Now(), serverXKey, data)
}

// answer is Answer for a request that arrived at arrived.
func (r *Responder) answer(ctx context.Context, arrived time.Time, serverXKey string, data []byte) ([]byte, Event) {
	req, reason := r.check(serverXKey, data, arrived)
	if reason != "" {
		ev := Event{Outcome: OutcomeDropped, Reason: reason, Sealed: serverXKey != ""}
		if req != nil {
			ev.UserNkey = req.claims.UserNkey
		}
		return nil, ev
	}
	ev := Event{UserNkey: req.claims.UserNkey, Sealed: req.serverKey != "", RequestExpiry: req.exp, Issuer: req.keys.resp.Public()}
	if req.keys.xkey != nil {
		ev.XKey = req.keys.xkey.Public()
	}

	// The resolver's deadline, on the injected clock: a key fetch that cannot
	// end in time is given up on (it goes on for the next attempt; see
	// verifier's refresh) and the request refused while the client listens.
	ctx, cancel := context.WithTimeout(ctx, req.resolveBy.Sub(r.cfg.Now()))
	defer cancel()
	subj, err := r.resolve(ctx, req.claims.ConnectOptions.Token)
	if err == nil && r.cfg.Quarantine != nil {
		err = r.cfg.Quarantine.CheckConnect(subj.ID)
	}
	var userJWT string
	if err == nil {
		userJWT, ev.UserJWTExpiry, err = r.userJWT(req, subj)
	}
	errStr := ""
	if err != nil {
		ev.Cluster = verifier.ClusterOf(err)
		ev.Reason = err.Error()
		errStr, ev.Outcome = AnswerNotAuthorized, OutcomeDenied
		if errors.Is(err, verifier.ErrKeysUnavailable) {
			errStr, ev.Outcome = AnswerKeysUnavailable, OutcomeKeysUnavailable
		}
	} else {
		ev.Outcome, ev.RunnerID, ev.Cluster, ev.UserIssuer = OutcomeAuthorized, subj.ID, clusterOf(subj), req.keys.user.Public()
		ci := req.claims.ClientInformation
		ev.ServerID, ev.ClientID, ev.ClientHost, ev.TokenID = req.claims.Server.ID, ci.ID, ci.Host, subj.TokenID
		if w := subj.Workload; w != nil {
			ev.NodeName, ev.NodeUID, ev.PodUID, ev.KeyID = w.NodeName, w.NodeUID, w.PodUID, w.KeyID
		}
	}
	resp, rerr := r.response(req, userJWT, errStr)
	if rerr != nil {
		return nil, Event{Outcome: OutcomeError, Reason: rerr.Error(), Cluster: ev.Cluster, UserNkey: ev.UserNkey, Sealed: ev.Sealed}
	}
	r.age(&ev, arrived) // ready to publish
	return resp, ev
}

// answered reports whether an outcome sends an answer to the server.
func answered(o Outcome) bool {
	return o == OutcomeAuthorized || o == OutcomeDenied || o == OutcomeKeysUnavailable
}

func clusterOf(s verifier.Subject) string {
	if s.Workload != nil {
		return s.Workload.Cluster
	}
	return ""
}

var errNoToken = errors.New("no auth_token in the connect options")

func (r *Responder) resolve(ctx context.Context, token string) (verifier.Subject, error) {
	if token == "" {
		return verifier.Subject{}, errNoToken
	}
	subj, err := r.cfg.Resolver.Resolve(ctx, token, verifier.SubjectRunner)
	if err != nil {
		return verifier.Subject{}, err
	}
	if subj.Kind != verifier.SubjectRunner {
		return verifier.Subject{}, fmt.Errorf("resolver returned a %s subject for a Runner", subj.Kind)
	}
	return subj, nil
}

func (r *Responder) logEvent(ctx context.Context, ev Event) {
	switch ev.Outcome {
	case OutcomeAuthorized:
		if r.log.Enabled(ctx, slog.LevelDebug) {
			r.log.Debug("runner authorized", "runner_id", ev.RunnerID, "cluster", ev.Cluster,
				"user_jwt_exp", ev.UserJWTExpiry, "sealed", ev.Sealed, "xkey", ev.XKey, "issuer", ev.Issuer, "latency", ev.Latency)
		}
	case OutcomeDenied, OutcomeKeysUnavailable:
		r.log.Warn("runner refused", "answer", answerOf(ev.Outcome), "cluster", ev.Cluster, "cause", ev.Reason)
	case OutcomeDropped:
		r.log.Warn("authorization request dropped", "reason", ev.Reason, "sealed", ev.Sealed)
	case OutcomeError:
		r.log.Error("authorization request not answered", "cluster", ev.Cluster, "error", ev.Reason)
	}
}

func answerOf(o Outcome) string {
	if o == OutcomeKeysUnavailable {
		return AnswerKeysUnavailable
	}
	return AnswerNotAuthorized
}
