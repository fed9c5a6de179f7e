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
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

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
	// minRemaining is the least time before a request's deadline worth
	// starting it with: less than that and the answer would arrive after the
	// client or the server has given up, so the work is skipped.
	minRemaining = 20 * time.Millisecond
	// answerReserve is kept between the resolver's deadline and the
	// request's: the time to sign, seal and publish the answer (a few hundred
	// µs) with room for a loaded machine's scheduling, so that a refusal
	// after a cut-short resolve still leaves before the deadline.
	answerReserve = 50 * time.Millisecond
)

// The answer horizon: how long after a request arrives its answer is still
// of use (Config.AnswerHorizon, compass-callout --answer-horizon).
//
// nats-server (v2.15) arms a client's first PING, 2 s plus up to 20 %
// jitter, when it reads the CONNECT, before it consults the callout; nats.go
// (v1.55) fails a CONNECT whose first line after its own PING is that PING
// ("nats: expected 'PONG', got 'PING'"). So a nats.go client, compass-runner
// included, waits about 2 s for the callout, whatever authorization {
// timeout } says; an answer later than that is wasted work (test/horizon
// pins both facts against the real server).
const (
	// DefaultAnswerHorizon leaves 200 ms of the earliest first PING for the
	// request's way from the server to the callout and the answer's way back.
	DefaultAnswerHorizon = 1800 * time.Millisecond
	// MinAnswerHorizon: below it a healthy callout, whose requests may queue
	// for tens of milliseconds, would drop requests the client still waits for.
	MinAnswerHorizon = 100 * time.Millisecond
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

// ConnectChecker refuses a Runner ID's connect with an error (nil: it may
// connect). It must not block: it is asked on every authorization.
type ConnectChecker interface {
	CheckConnect(runnerID string) error
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
	// Next, when set, holds the keys a rotation moves the servers to, beside
	// the current ones above, for as long as a NATS cluster runs both
	// configurations (rotation.go). Each request is answered with the keys
	// its server expects.
	Next *NextKeys

	// MaxLifetime caps user JWTs (DefaultMaxLifetime when zero).
	MaxLifetime time.Duration
	// AnswerHorizon is how long after its arrival a request is still
	// answered (DefaultAnswerHorizon when zero; at least MinAnswerHorizon).
	// A request's deadline is the earlier of its exp and its arrival plus
	// the horizon: one already past it is dropped before any signature
	// check, and the resolver is given until just before it, so a slow key
	// fetch ends in the usual refusal while the client still listens.
	AnswerHorizon time.Duration
	// Workers is the number of requests handled at once (default 4 per CPU):
	// each request gets its own goroutine while there is room, then as many
	// worker goroutines take from a bounded queue, newest first.
	Workers int
	// Queue is the queue group (default DefaultQueue).
	Queue string

	// Quarantine, if set, refuses the connects of quarantined Runner IDs
	// (*Quarantine has it; DL-459).
	Quarantine ConnectChecker

	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives decisions and causes; never a token or a seed.
	Logger *slog.Logger
	// Observe, if set, is called once per request after it is answered or
	// dropped. It must not block.
	Observe func(Event)
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
	// The keys answers are made with (rotation.go): every xkey held, current
	// first, and the signers of each generation (server-config mode: one per
	// issuer; operator mode: one per xkey, or the one generation when plain).
	xkeys []*XKey
	gens  []keyGen
	log   *slog.Logger

	jobs     *stack
	slots    chan struct{} // one per request being handled; capacity Workers
	stopping atomic.Bool   // intake closed: deliveries are dropped
	inlineMu sync.RWMutex  // read-held by callbacks; drain write-locks it to wait for them
	// (a callback starting a request's goroutine adds it to wg under it)
	inflight atomic.Int64
	wg       sync.WaitGroup
	done     chan struct{}
	subs     []*nats.Subscription    // set by Start before any goroutine reads it
	lanes    atomic.Pointer[[]*lane] // each subscription's connection's lag, as subs; set once by Start
	probes   sync.WaitGroup          // the lanes' probes, which end with Start's context
	work     context.Context         // Start's context without its cancellation
	// drainWait bounds the drain: the constant drainWait, which tests
	// shorten to see a drain give up.
	drainWait time.Duration
	started   atomic.Bool

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
	if cfg.MaxLifetime > MaxMaxLifetime {
		return nil, fmt.Errorf("callout: config: MaxLifetime %s is above the maximum %s", cfg.MaxLifetime, MaxMaxLifetime)
	}
	if cfg.AnswerHorizon == 0 {
		cfg.AnswerHorizon = DefaultAnswerHorizon
	}
	if cfg.AnswerHorizon < MinAnswerHorizon {
		return nil, fmt.Errorf("callout: config: AnswerHorizon %s is below the minimum %s", cfg.AnswerHorizon, MinAnswerHorizon)
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
	r := &Responder{cfg: cfg, log: log, done: make(chan struct{}), replay: map[string]int64{}, drainWait: drainWait}
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
	if cfg.XKey != nil {
		r.xkeys = []*XKey{cfg.XKey}
	}
	r.gens = []keyGen{{resp: cfg.ResponseSigner, respIssAcct: r.respIssAcct, user: r.userSigner, userIssAcct: r.userIssAcct}}
	if err := r.holdNext(cfg); err != nil {
		return nil, err
	}
	r.jobs = newStack(cfg.Workers * queuePerWorker)
	r.slots = make(chan struct{}, cfg.Workers)
	return r, nil
}

// RunnerAccount is the account the callout places Runners in (its name in
// server-config mode, its public key in operator mode), and the issuer a
// NATS server reports for the users the callout grants there: the signing
// key when user JWTs carry issuer_account, else the account itself.
func (r *Responder) RunnerAccount() (account, issuer string) {
	if r.userIssAcct != "" {
		return r.audience, r.userSigner.Public()
	}
	return r.audience, r.audience
}

// InFlight is the number of requests queued or being handled.
func (r *Responder) InFlight() int64 { return r.inflight.Load() }

// NATSLag is the longest lag of the responder's connections now: how late
// the server would handle an answer published on the worst of them (see
// lag.go). Zero before Start.
func (r *Responder) NATSLag() time.Duration {
	var d time.Duration
	if ls := r.lanes.Load(); ls != nil {
		for _, l := range *ls {
			d = max(d, l.lag())
		}
	}
	return d
}

// Done is closed when the responder has drained after Start's context ended.
func (r *Responder) Done() <-chan struct{} { return r.done }
