// Package callout is the NATS auth-callout responder of compass-callout
// (DL-316). It answers the server's authorization requests on
// $SYS.REQ.USER.AUTH: it checks the request, resolves the connect options'
// auth_token through a Resolver (the shared verifier, with the door's shape
// dispatch) and answers with a user JWT whose permissions are exactly the
// Runner's subjects. It holds no token logic of its own.
//
// It works in server-config mode (authorization { auth_callout {...} }) and in
// operator mode (an account with an authorization block), with or without
// xkey encryption, on any number of connections in one queue group.
package callout

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/verifier"
)

// Subject is where the server publishes authorization requests.
const Subject = "$SYS.REQ.USER.AUTH"

// RequestAudience is the audience of every genuine authorization request.
const RequestAudience = "nats-authorization-request"

// XKeyHeader names the server's public xkey on a sealed request.
const XKeyHeader = "Nats-Server-Xkey"

// DefaultQueue is the queue group replicas share.
const DefaultQueue = "compass-callout"

// The only two failure answers a client can see (DL-316). They reveal nothing
// about the token or why it failed.
const (
	AnswerNotAuthorized   = "not authorized"
	AnswerKeysUnavailable = "runner cluster keys unavailable"
)

// Limits, each with its reason.
const (
	// MaxRequestBytes caps a request before it is opened or decoded. A genuine
	// request is a few KiB (the token is at most verifier.MaxTokenBytes, plus
	// the client's TLS chain when it sent one).
	MaxRequestBytes = 256 << 10
	// maxReplaySet bounds the set of user nkeys already answered. Entries leave
	// when their request expires (the server's auth timeout, seconds), so the
	// set holds a few seconds of connects; at the bound it is cleared, which
	// only reopens replay of requests the server has given up on anyway.
	maxReplaySet = 1 << 20
	// queuePerWorker sizes the hand-off stack between subscriptions and
	// workers: more requests than a worker can answer within any auth timeout
	// (a few hundred per second each), so nothing answerable is evicted, and
	// a bounded amount of memory (a request is a few KiB).
	queuePerWorker = 256
	// minRemaining is the least time before a request's expiry worth starting
	// it with: less than that and the answer would arrive after the server
	// has given up, so the work is skipped.
	minRemaining = 20 * time.Millisecond
)

// Resolver authenticates a presented token; *verifier.Resolver satisfies it.
type Resolver interface {
	Resolve(ctx context.Context, token string, want verifier.SubjectKind) (verifier.Subject, error)
}

// Mode is the NATS auth mode the server runs in.
type Mode int

const (
	// ModeServerConfig: authorization { auth_callout { issuer, auth_users, account, xkey } }.
	// Requests name the issuer; responses and user JWTs are signed by it; the
	// user JWT's audience is the target account's name.
	ModeServerConfig Mode = iota + 1
	// ModeOperator: the callout account's JWT carries authorization
	// {auth_users, allowed_accounts, xkey}. Responses are signed by the callout
	// account (or a signing key of it); user JWTs by the target account (or a
	// signing key of it, with issuer_account).
	ModeOperator
)

func (m Mode) String() string {
	switch m {
	case ModeServerConfig:
		return "server-config"
	case ModeOperator:
		return "operator"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Config configures a Responder.
type Config struct {
	Mode     Mode
	Resolver Resolver

	// ResponseSigner signs authorization responses. Server-config mode: the
	// auth_callout issuer account key, which also signs user JWTs. Operator
	// mode: the callout account key or one of its signing keys.
	ResponseSigner *Signer
	// CalloutAccount is the callout account's public key in operator mode
	// (default: ResponseSigner's key). When ResponseSigner is a signing key of
	// it, responses carry it as issuer_account.
	CalloutAccount string

	// UserSigner signs user JWTs in operator mode: the target account key or
	// one of its signing keys. Unused (must be nil) in server-config mode.
	UserSigner *Signer
	// Account is the target account: its name in server-config mode (the user
	// JWT's audience), its public key in operator mode (default: UserSigner's
	// key; when UserSigner is a signing key, user JWTs carry it as issuer_account).
	Account string

	// XKey, when set, is the callout's curve key: requests must be sealed to it
	// and answers are sealed to the server. When nil, sealed requests are refused.
	XKey *XKey

	// MaxLifetime caps user JWTs (DefaultMaxLifetime when zero).
	MaxLifetime time.Duration
	// Workers is the number of requests handled at once (default 4 per CPU),
	// by the subscriptions' own goroutines while there is room, then by as
	// many worker goroutines taking from a bounded queue, newest first.
	Workers int
	// Queue is the queue group (default DefaultQueue).
	Queue string

	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives decisions and causes; never a token or a seed.
	Logger *slog.Logger
	// Observe, if set, is called once per request after it is answered or
	// dropped. It must not block.
	Observe func(Event)
}

// Outcome is what happened to one request.
type Outcome string

const (
	OutcomeAuthorized      Outcome = "authorized"
	OutcomeDenied          Outcome = "denied"           // answered "not authorized"
	OutcomeKeysUnavailable Outcome = "keys_unavailable" // answered "runner cluster keys unavailable"
	OutcomeDropped         Outcome = "dropped"          // not answered (see Event.Reason)
	OutcomeError           Outcome = "error"            // could not answer (encode or publish failed)
)

// Drop reasons: requests that get no answer at all.
const (
	DropExpired       = "expired"        // past its exp: the server has given up on it
	DropInvalid       = "invalid"        // bad JWT, signature, issuer, audience or user nkey
	DropSealMismatch  = "seal_mismatch"  // plain with an xkey configured, or sealed without one
	DropUndecryptable = "undecryptable"  // sealed, but not to our xkey
	DropReplayed      = "replayed"       // a user nkey already answered
	DropTooLarge      = "too_large"      // over MaxRequestBytes
	DropWrongSubject  = "wrong_callout"  // request addressed to another issuer or callout account
	DropShuttingDown  = "shutting_down"  // queued when the responder drained
	DropNoReply       = "no_reply"       // no reply subject
	DropServerXKeyMis = "xkey_not_bound" // header xkey differs from the one the server signed
	DropOverload      = "overload"       // evicted from a full queue (the oldest goes first)
)

// Event is one request's decision, for metrics and tests.
type Event struct {
	Outcome  Outcome
	Reason   string // drop reason, or the failure cause (safe to log)
	Cluster  string // cluster the token named, when known
	RunnerID string // on success
	UserNkey string // the request's user nkey, when decoded
	Sealed   bool
	Latency  time.Duration // from dequeue to answer
	// RequestExpiry is the request's exp (whole seconds; the server gives up
	// at or a little after it), when the request was decoded.
	RequestExpiry time.Time
	// Slack is, for an answered request, the time left before RequestExpiry
	// when the answer was published: how close the responder runs to the
	// server giving up. It shrinks toward zero under overload.
	Slack time.Duration
	// UserJWTExpiry is the user JWT's exp on success.
	UserJWTExpiry time.Time
}

// Responder answers authorization requests. Create it with New, start it with
// Start; it drains when Start's context ends.
type Responder struct {
	cfg         Config
	reqSubject  string // the request's sub: issuer (config) or callout account (operator)
	respIssAcct string
	userSigner  *Signer
	userIssAcct string
	audience    string
	log         *slog.Logger

	jobs     *stack
	slots    chan struct{} // one per request being handled; capacity Workers
	stopping atomic.Bool   // intake closed: deliveries are dropped
	inlineMu sync.RWMutex  // read-held by callbacks; drain write-locks it to wait for them
	inflight atomic.Int64
	wg       sync.WaitGroup
	done     chan struct{}
	subs     []*nats.Subscription // set by Start before any goroutine reads it
	work     context.Context      // Start's context without its cancellation
	started  atomic.Bool

	replayMu sync.Mutex
	replay   map[string]int64 // user nkey -> request exp (unix)
	replayGC int64            // next unix second to prune
}

// New checks cfg and returns a Responder.
func New(cfg Config) (*Responder, error) {
	if cfg.Resolver == nil {
		return nil, errors.New("callout: config: Resolver is required")
	}
	if cfg.ResponseSigner == nil {
		return nil, errors.New("callout: config: ResponseSigner is required")
	}
	if cfg.ResponseSigner.Prefix() != nkeys.PrefixByteAccount {
		return nil, fmt.Errorf("callout: config: ResponseSigner must be an account key, not %s", cfg.ResponseSigner.Prefix())
	}
	if cfg.MaxLifetime == 0 {
		cfg.MaxLifetime = DefaultMaxLifetime
	}
	if cfg.MaxLifetime < MinMaxLifetime {
		return nil, fmt.Errorf("callout: config: MaxLifetime %s is below the minimum %s", cfg.MaxLifetime, MinMaxLifetime)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4 * runtime.GOMAXPROCS(0)
	}
	if cfg.Queue == "" {
		cfg.Queue = DefaultQueue
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	r := &Responder{cfg: cfg, log: log, done: make(chan struct{}), replay: map[string]int64{}}
	switch cfg.Mode {
	case ModeServerConfig:
		if cfg.UserSigner != nil || cfg.CalloutAccount != "" {
			return nil, errors.New("callout: config: server-config mode signs everything with the issuer; UserSigner and CalloutAccount are operator-mode settings")
		}
		if cfg.Account == "" {
			return nil, errors.New("callout: config: Account (the target account name) is required")
		}
		r.reqSubject = cfg.ResponseSigner.Public()
		r.userSigner = cfg.ResponseSigner
		r.audience = cfg.Account
	case ModeOperator:
		r.reqSubject = cfg.ResponseSigner.Public()
		if cfg.CalloutAccount != "" {
			if !nkeys.IsValidPublicAccountKey(cfg.CalloutAccount) {
				return nil, errors.New("callout: config: CalloutAccount must be an account public key")
			}
			r.reqSubject = cfg.CalloutAccount
			if cfg.CalloutAccount != cfg.ResponseSigner.Public() {
				r.respIssAcct = cfg.CalloutAccount
			}
		}
		if cfg.UserSigner == nil {
			return nil, errors.New("callout: config: operator mode needs UserSigner (the target account key or its signing key)")
		}
		if cfg.UserSigner.Prefix() != nkeys.PrefixByteAccount {
			return nil, fmt.Errorf("callout: config: UserSigner must be an account key, not %s", cfg.UserSigner.Prefix())
		}
		r.userSigner = cfg.UserSigner
		r.audience = cfg.UserSigner.Public()
		if cfg.Account != "" {
			if !nkeys.IsValidPublicAccountKey(cfg.Account) {
				return nil, errors.New("callout: config: in operator mode Account is the target account's public key")
			}
			r.audience = cfg.Account
			if cfg.Account != cfg.UserSigner.Public() {
				r.userIssAcct = cfg.Account
			}
		}
	default:
		return nil, errors.New("callout: config: Mode must be ModeServerConfig or ModeOperator")
	}
	r.jobs = newStack(cfg.Workers * queuePerWorker)
	r.slots = make(chan struct{}, cfg.Workers)
	return r, nil
}

// InFlight is the number of requests queued or being handled.
func (r *Responder) InFlight() int64 { return r.inflight.Load() }

// Done is closed when the responder has drained after Start's context ended.
func (r *Responder) Done() <-chan struct{} { return r.done }

// drainWait bounds how long a drain waits for the subscriptions to hand over
// the requests nats.go has already received: longer than any request's
// expiry (the server's auth timeout, 2 s by default), after which the server
// has given up on them anyway.
const drainWait = 5 * time.Second

// startFlushTimeout bounds the round trip that confirms the server has a
// subscription; on loopback or in a cluster it is milliseconds.
const startFlushTimeout = 10 * time.Second

// Start subscribes to Subject in the queue group on every connection and
// starts the workers. It returns once the server has every subscription (so
// the next CONNECT is answered). When ctx ends the responder stops taking
// requests, finishes the ones already received (each bounded by its own
// expiry) and closes Done. Start may be called once.
func (r *Responder) Start(ctx context.Context, conns ...*nats.Conn) error {
	if len(conns) == 0 {
		return errors.New("callout: start: no NATS connection")
	}
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("callout: start: already started")
	}
	// Requests are resolved under their own expiry, not under ctx, so that a
	// drain finishes the work already accepted.
	r.work = context.WithoutCancel(ctx)
	for i, nc := range conns {
		sub, err := nc.QueueSubscribe(Subject, r.cfg.Queue, r.enqueue)
		if err == nil {
			// The server may burst thousands of requests at once; queueing in
			// the client instead of dropping them as a slow consumer is what
			// lets a reconnect storm complete.
			err = sub.SetPendingLimits(-1, -1)
		}
		if err == nil {
			fctx, cancel := context.WithTimeout(ctx, startFlushTimeout)
			err = nc.FlushWithContext(fctx)
			cancel()
		}
		if err != nil {
			r.closeIntake()
			close(r.done)
			return fmt.Errorf("callout: start: subscribe on connection %d: %w", i, err)
		}
		r.subs = append(r.subs, sub)
	}
	for range r.cfg.Workers {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for m := r.jobs.pop(); m != nil; m = r.jobs.pop() {
				r.slots <- struct{}{}
				r.handle(r.work, m)
				<-r.slots
				r.inflight.Add(-1)
			}
		}()
	}
	go func() {
		<-ctx.Done()
		r.drain()
	}()
	return nil
}

// enqueue is every subscription's callback: it hands the request to the
// workers and never blocks (when the stack is full the oldest request goes).
//
// When fewer than Workers requests are being handled, the callback handles m
// itself: it is the newest request, which a worker would take first anyway,
// and this saves a goroutine hand-off on the latency of every CONNECT.
func (r *Responder) enqueue(m *nats.Msg) {
	// Held while this callback may handle m, so that a drain can wait for it.
	r.inlineMu.RLock()
	defer r.inlineMu.RUnlock()
	if r.stopping.Load() {
		r.observe(r.work, Event{Outcome: OutcomeDropped, Reason: DropShuttingDown, Sealed: m.Header.Get(XKeyHeader) != ""})
		return
	}
	r.inflight.Add(1)
	select {
	case r.slots <- struct{}{}:
		r.handle(r.work, m)
		<-r.slots
		r.inflight.Add(-1)
		return
	default:
	}
	if old := r.jobs.push(m); old != nil {
		r.inflight.Add(-1)
		reason := DropOverload
		if old == m {
			reason = DropShuttingDown
		}
		r.observe(r.work, Event{Outcome: OutcomeDropped, Reason: reason, Sealed: old.Header.Get(XKeyHeader) != ""})
	}
}

// closeIntake makes later deliveries drop and lets the workers end once the
// stack is empty.
func (r *Responder) closeIntake() {
	r.stopping.Store(true)
	r.jobs.close()
}

// drain unsubscribes, waits (bounded) for nats.go to deliver what it already
// received, lets the workers finish the queue and closes Done.
func (r *Responder) drain() {
	for _, s := range r.subs {
		// The server stops sending; messages already received are still delivered.
		_ = s.Drain()
	}
	timer := time.NewTimer(drainWait)
	defer timer.Stop()
wait:
	for _, s := range r.subs {
		select {
		case <-s.StatusChanged(nats.SubscriptionClosed):
		case <-timer.C:
			break wait
		}
	}
	r.closeIntake()
	// Wait for callbacks handling a request themselves, then for the workers.
	r.inlineMu.Lock()
	//lint:ignore SA2001 the empty critical section is the wait: every callback holds the read lock while it works
	r.inlineMu.Unlock()
	r.wg.Wait()
	close(r.done)
}

// handle decides one request and answers it, or drops it.
func (r *Responder) handle(ctx context.Context, m *nats.Msg) {
	start := time.Now()
	ev := r.decide(ctx, m)
	end := time.Now()
	ev.Latency = end.Sub(start)
	if answered(ev.Outcome) && !ev.RequestExpiry.IsZero() {
		ev.Slack = ev.RequestExpiry.Sub(end)
	}
	r.observe(ctx, ev)
}

func (r *Responder) observe(ctx context.Context, ev Event) {
	r.logEvent(ctx, ev)
	if r.cfg.Observe != nil {
		r.cfg.Observe(ev)
	}
}

// request is a checked authorization request.
type request struct {
	claims    *jwt.AuthorizationRequestClaims
	serverKey string // server xkey to seal the answer to; "" when plain
	exp       time.Time
}

// decide answers one delivered request, or drops it.
func (r *Responder) decide(ctx context.Context, m *nats.Msg) Event {
	if m.Reply == "" {
		return Event{Outcome: OutcomeDropped, Reason: DropNoReply}
	}
	resp, ev := r.Answer(ctx, m.Header.Get(XKeyHeader), m.Data)
	if resp == nil {
		return ev
	}
	if err := m.Respond(resp); err != nil {
		return Event{Outcome: OutcomeError, Reason: fmt.Sprintf("callout: publish response: %v", err),
			Cluster: ev.Cluster, UserNkey: ev.UserNkey, Sealed: ev.Sealed}
	}
	return ev
}

// Answer runs the per-request steps on a request's payload and its
// Nats-Server-Xkey header value ("" when absent). It returns the response
// payload to publish, or nil when the request is dropped (Event says why).
// It does no I/O other than the resolver's.
func (r *Responder) Answer(ctx context.Context, serverXKey string, data []byte) ([]byte, Event) {
	req, reason := r.check(serverXKey, data)
	if reason != "" {
		ev := Event{Outcome: OutcomeDropped, Reason: reason, Sealed: serverXKey != ""}
		if req != nil {
			ev.UserNkey = req.claims.UserNkey
		}
		return nil, ev
	}
	ev := Event{UserNkey: req.claims.UserNkey, Sealed: req.serverKey != "", RequestExpiry: req.exp}

	ctx, cancel := context.WithDeadline(ctx, req.exp)
	defer cancel()
	subj, err := r.resolve(ctx, req.claims.ConnectOptions.Token)
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
		ev.Outcome, ev.RunnerID, ev.Cluster = OutcomeAuthorized, subj.ID, clusterOf(subj)
	}
	resp, rerr := r.response(req, userJWT, errStr)
	if rerr != nil {
		return nil, Event{Outcome: OutcomeError, Reason: rerr.Error(), Cluster: ev.Cluster, UserNkey: ev.UserNkey, Sealed: ev.Sealed}
	}
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

// check opens and validates a request. A non-empty reason means drop it.
func (r *Responder) check(hdrKey string, data []byte) (*request, string) {
	if len(data) > MaxRequestBytes {
		return nil, DropTooLarge
	}
	switch {
	case r.cfg.XKey != nil && hdrKey == "":
		return nil, DropSealMismatch
	case r.cfg.XKey == nil && hdrKey != "":
		return nil, DropSealMismatch
	case hdrKey != "":
		opened, err := r.cfg.XKey.Open(data, hdrKey)
		if err != nil {
			return nil, DropUndecryptable
		}
		data = opened
	}
	// Before the signature check, the cheap part: a request the server is
	// about to give up on is not worth verifying (under overload this is most
	// of what is dropped). The unverified exp can only make us drop.
	if exp, ok := peekExpiry(data); !ok {
		return nil, DropInvalid
	} else if !r.cfg.Now().Add(minRemaining).Before(time.Unix(exp, 0)) {
		return nil, DropExpired
	}
	// Decode verifies the signature against the issuer in the claims and that
	// the issuer is a server nkey.
	claims, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, DropInvalid
	}
	req := &request{claims: claims, serverKey: hdrKey}
	vr := jwt.CreateValidationResults()
	claims.Validate(vr) // user nkey shape; times are checked below with our clock
	switch {
	case !nkeys.IsValidPublicServerKey(claims.Issuer):
		return req, DropInvalid
	case claims.Audience != RequestAudience:
		return req, DropInvalid
	case claims.Server.ID != claims.Issuer:
		// The server signs with the key its ID is; the answer's audience is
		// that ID, so it must be the signer.
		return req, DropInvalid
	case !nkeys.IsValidPublicUserKey(claims.UserNkey):
		return req, DropInvalid
	case claims.Subject != r.reqSubject:
		return req, DropWrongSubject
	case claims.Expires <= 0:
		return req, DropInvalid
	case hdrKey != "" && claims.Server.XKey != hdrKey:
		return req, DropServerXKeyMis
	}
	for _, is := range vr.Issues {
		if !is.TimeCheck {
			return req, DropInvalid
		}
	}
	now := r.cfg.Now()
	req.exp = time.Unix(claims.Expires, 0)
	if !now.Before(req.exp) {
		return req, DropExpired
	}
	if claims.NotBefore > 0 && now.Unix() < claims.NotBefore {
		return req, DropInvalid
	}
	if !r.firstUse(claims.UserNkey, claims.Expires, now.Unix()) {
		return req, DropReplayed
	}
	return req, ""
}

// peekExpiry reads a JWT's exp without verifying anything.
func peekExpiry(tok []byte) (int64, bool) {
	first := bytes.IndexByte(tok, '.')
	if first < 0 {
		return 0, false
	}
	rest := tok[first+1:]
	second := bytes.IndexByte(rest, '.')
	if second < 0 {
		return 0, false
	}
	payload := make([]byte, base64.RawURLEncoding.DecodedLen(second))
	n, err := base64.RawURLEncoding.Decode(payload, rest[:second])
	if err != nil {
		return 0, false
	}
	var c struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload[:n], &c); err != nil || c.Exp <= 0 {
		return 0, false
	}
	return c.Exp, true
}

// firstUse records a user nkey and reports whether it was new. The server
// creates a fresh user nkey for every CONNECT, so a second request with the
// same one is a replay.
func (r *Responder) firstUse(userNkey string, exp, now int64) bool {
	r.replayMu.Lock()
	defer r.replayMu.Unlock()
	if now >= r.replayGC || len(r.replay) >= maxReplaySet {
		for k, e := range r.replay {
			if e < now || len(r.replay) >= maxReplaySet {
				delete(r.replay, k)
			}
		}
		r.replayGC = now + 1
	}
	if _, seen := r.replay[userNkey]; seen {
		return false
	}
	r.replay[userNkey] = exp
	return true
}

// userJWT issues the Runner's user JWT, validated before it is signed.
func (r *Responder) userJWT(req *request, subj verifier.Subject) (string, time.Time, error) {
	perms, err := RunnerPermissions(subj.ID)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("runner ID is not a subject token: %w", err)
	}
	exp, err := UserExpiry(r.cfg.Now(), subj.NotAfter, r.cfg.MaxLifetime)
	if err != nil {
		return "", time.Time{}, err
	}
	uc := jwt.NewUserClaims(req.claims.UserNkey)
	uc.Name = subj.ID
	uc.Audience = r.audience
	uc.Expires = exp.Unix()
	uc.Permissions = perms
	uc.IssuerAccount = r.userIssAcct
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if len(vr.Issues) > 0 {
		return "", time.Time{}, fmt.Errorf("user JWT does not validate: %s", vr.Issues[0].Description)
	}
	tok, err := uc.Encode(r.userSigner)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("encode user JWT: %w", err)
	}
	return tok, exp, nil
}

// response encodes the answer (a user JWT or an error string), sealed when
// the request was.
func (r *Responder) response(req *request, userJWT, errStr string) ([]byte, error) {
	rc := jwt.NewAuthorizationResponseClaims(req.claims.UserNkey)
	rc.Audience = req.claims.Server.ID
	rc.Jwt = userJWT
	rc.Error = errStr
	rc.IssuerAccount = r.respIssAcct
	// The server gives up at the request's expiry; the answer need not live longer.
	rc.Expires = req.claims.Expires
	tok, err := rc.Encode(r.cfg.ResponseSigner)
	if err != nil {
		return nil, fmt.Errorf("callout: encode response: %w", err)
	}
	data := []byte(tok)
	if req.serverKey != "" {
		if data, err = r.cfg.XKey.Seal(data, req.serverKey); err != nil {
			return nil, fmt.Errorf("callout: seal response: %w", err)
		}
	}
	return data, nil
}

func (r *Responder) logEvent(ctx context.Context, ev Event) {
	switch ev.Outcome {
	case OutcomeAuthorized:
		if r.log.Enabled(ctx, slog.LevelDebug) {
			r.log.Debug("runner authorized", "runner_id", ev.RunnerID, "cluster", ev.Cluster,
				"user_jwt_exp", ev.UserJWTExpiry, "sealed", ev.Sealed, "latency", ev.Latency)
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
