// Package store is the Server's persistent state: minted tokens (kept only as
// their SHA-256), the tenant every subject is stamped with, and the registry of
// enrolled Runners.
//
// Two backends share one schema and one numbered list of migrations, embedded
// in the binary: SQLite (modernc.org/sqlite, pure Go, one file in a data
// directory) and PostgreSQL (pgx), for Servers and callouts that share a
// database. Open, OpenCurrent and Migrate pick the backend from the URL:
// Migrate applies pending migrations explicitly, OpenCurrent opens a database
// only at exactly the schema this binary wants (it never creates or migrates
// one), and Open migrates as it opens.
//
// A Store implements verifier.TokenStore, so it plugs into verifier.NewResolver.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/verifier"
)

// Errors. Every error a Store returns is prefixed "store:" and wraps one of
// these (or a verifier sentinel) where one applies, for errors.Is.
var (
	// ErrNotFound: no token with that public ID, or no Runner with that ID.
	ErrNotFound = errors.New("store: not found")

	// ErrConflict: a token with the same hash is already stored.
	ErrConflict = errors.New("store: already exists")

	// ErrSchemaTooNew: the database was migrated by a newer binary.
	ErrSchemaTooNew = errors.New("store: database schema is newer than this binary")

	// ErrSchemaBehind: the database has not been migrated to the schema this
	// binary wants (OpenCurrent); Migrate brings it there.
	ErrSchemaBehind = errors.New("store: database schema is older than this binary")

	// ErrNoDatabase: OpenCurrent or Backup found no SQLite file at the path;
	// they never create one.
	ErrNoDatabase = errors.New("store: no database")

	// ErrInvalidURL: Open cannot tell which database a URL names.
	ErrInvalidURL = errors.New("store: invalid database URL")
)

// Invalid tokens, subject IDs and enrollments wrap verifier.ErrInvalidArgument;
// a missing token hash wraps verifier.ErrTokenNotFound.

// MinStoredTokenBytes is the shortest token StoreTokenHash accepts. Tokens are
// looked up by their unsalted SHA-256, which is only safe for tokens with the
// entropy of a generated one: GenerateToken gives 43 characters of base64 (256
// bits); 32 characters of base64 is still 192 bits.
const MinStoredTokenBytes = 32

// MaxRunnerIDLen bounds a Runner ID in the registry: a workload Runner ID is a
// cluster name (at most 40 bytes), "/", and an RFC 1123 node name (at most 253
// bytes). Minted Runner IDs are shorter (verifier.MaxSubjectIDLen).
const MaxRunnerIDLen = 40 + 1 + 253

// MaxEnrollmentFieldLen bounds the Kubernetes names and UIDs recorded with an
// enrollment (cluster, node, pod): object names are at most 253 bytes and UIDs
// 36, so anything longer is not from a real token.
const MaxEnrollmentFieldLen = 253

// MaxReportedLen bounds what a Runner reports of itself at enrollment
// (version, hostname): a host name is at most 253 bytes, a version far less;
// the rest is room, not a use.
const MaxReportedLen = 512

// Store is what the Server (the door, serve, the operator CLI) and the callout
// need from the database. All methods are safe for concurrent use.
type Store interface {
	// LookupTokenHash finds a minted token by its SHA-256. It returns an error
	// wrapping verifier.ErrTokenNotFound when no token has that hash, and the
	// token with Revoked set when it was revoked.
	verifier.TokenStore

	// Mint generates a token for a new subject of the given kind, stores its
	// hash and returns the token, which is never stored and cannot be shown
	// again, with the token's public record. IDs are checked with
	// verifier.CheckSubjectID: a Runner ID containing "/" fails with an error
	// wrapping verifier.ErrInvalidArgument, as does a TTL CheckTTL refuses.
	//
	// Minting again for an ID that already has tokens adds one more: the
	// earlier tokens are not replaced and stay valid until revoked or
	// expired, each under its own public ID.
	Mint(ctx context.Context, kind verifier.SubjectKind, id string, opts ...MintOption) (token string, info TokenInfo, err error)

	// StoreTokenHash stores the hash of a token generated elsewhere. A token
	// containing ".", shorter than MinStoredTokenBytes, or a subject ID that
	// verifier.CheckSubjectID refuses fails with an error wrapping
	// verifier.ErrInvalidArgument, as does a TTL CheckTTL refuses; a token
	// already stored fails with ErrConflict. Errors never contain the token.
	StoreTokenHash(ctx context.Context, token string, kind verifier.SubjectKind, id string, opts ...MintOption) (TokenInfo, error)

	// Revoke marks the token with the given public ID revoked, at the store's
	// clock. Revoking a revoked token keeps its first revocation time and is
	// not an error. An unknown ID is ErrNotFound.
	Revoke(ctx context.Context, tokenID string) (TokenInfo, error)

	// ListTokens returns every token's public record, oldest first. It never
	// returns a hash.
	ListTokens(ctx context.Context) ([]TokenInfo, error)

	// CountRunnerTokenIDsWithSlash counts live (neither revoked nor expired
	// at the store's clock) Runner tokens whose subject ID contains "/": rows
	// minted before "/" was reserved for workload Runner IDs. serve refuses
	// to start with clusters configured while it is non-zero (DL-440).
	CountRunnerTokenIDsWithSlash(ctx context.Context) (int64, error)

	// BootstrapTenant returns the ID of the tenant created by the first
	// migration, which is stamped on every subject.
	BootstrapTenant(ctx context.Context) (string, error)

	// RecordEnrollment records that a Runner enrolled. The first enrollment
	// of an ID creates the Runner; later ones update how it authenticated,
	// where it runs and last_enrolled_at, and report whether the node UID
	// changed (the node was rebuilt under the same name). A zero At means
	// the store's clock.
	RecordEnrollment(ctx context.Context, e Enrollment) (EnrollResult, error)

	// TouchRunner advances a Runner's last_seen time to at (it never moves
	// back). An unknown Runner is ErrNotFound.
	TouchRunner(ctx context.Context, runnerID string, at time.Time) error

	// ListRunners returns every enrolled Runner, ordered by ID.
	ListRunners(ctx context.Context) ([]Runner, error)

	// GetRunner returns one Runner, or ErrNotFound.
	GetRunner(ctx context.Context, runnerID string) (Runner, error)

	// GetQuarantine returns the displacement record of a Runner ID
	// (quarantine.go), or ErrNotFound when none was recorded. The door
	// refuses Enroll for an ID whose record is Quarantined.
	GetQuarantine(ctx context.Context, runnerID string) (Quarantine, error)

	// ListQuarantined returns every quarantined Runner ID's record, ordered
	// by ID.
	ListQuarantined(ctx context.Context) ([]Quarantine, error)

	// ClearQuarantine ends a Runner ID's quarantine (compass-server
	// clear-quarantine): its record is deleted, displacements included, and
	// returned. An ID that is not quarantined is ErrNotFound.
	ClearQuarantine(ctx context.Context, runnerID string) (Quarantine, error)

	// SchemaVersion is the highest migration applied to the database.
	SchemaVersion(ctx context.Context) (int, error)

	// Backend names the backend: "sqlite" or "postgres".
	Backend() string

	// Close releases the database. It does not wait for calls in flight on
	// other goroutines to be cancelled; callers stop using the Store first.
	Close() error
}

// TokenInfo is the public record of a minted token. It has no hash and no
// token, so it may be printed and logged.
type TokenInfo struct {
	// ID is the token's public ID, 16 lowercase hex digits drawn at random
	// when the token is stored: it is unrelated to the token and its hash.
	ID        string
	Kind      verifier.SubjectKind
	SubjectID string
	Tenant    string
	CreatedAt time.Time
	RevokedAt time.Time // zero while the token is valid
	ExpiresAt time.Time // zero: the token never expires (minted without a TTL)
}

// Revoked reports whether the token was revoked.
func (t TokenInfo) Revoked() bool { return !t.RevokedAt.IsZero() }

// Expired reports whether the token has expired at now: from ExpiresAt on,
// verifier.Resolver.Resolve refuses it.
func (t TokenInfo) Expired(now time.Time) bool {
	return !t.ExpiresAt.IsZero() && !now.Before(t.ExpiresAt)
}

// Bounds of a minted token's TTL.
const (
	// MinTokenTTL: the NATS user JWT a token is granted expires in whole
	// seconds, so a token living less than a second could never connect.
	MinTokenTTL = time.Second

	// MaxTokenTTL: 366 days. A TTL is for credentials meant to end (a CI
	// job's, a contractor's, a temporary host's); one longer than a year is
	// no safer than none and far more likely a mistyped unit (8760h meant
	// 876h). A token that should not end is minted without a TTL and revoked.
	MaxTokenTTL = 366 * 24 * time.Hour
)

// CheckTTL refuses a TTL that is not positive, under MinTokenTTL or over
// MaxTokenTTL, with an error wrapping verifier.ErrInvalidArgument.
func CheckTTL(ttl time.Duration) error {
	switch {
	case ttl <= 0:
		return fmt.Errorf("store: %w: token TTL %s is not positive", verifier.ErrInvalidArgument, ttl)
	case ttl < MinTokenTTL:
		return fmt.Errorf("store: %w: token TTL %s is under the minimum %s", verifier.ErrInvalidArgument, ttl, MinTokenTTL)
	case ttl > MaxTokenTTL:
		return fmt.Errorf("store: %w: token TTL %s is over the maximum %s (366 days)", verifier.ErrInvalidArgument, ttl, MaxTokenTTL)
	}
	return nil
}

// MintOption configures Mint and StoreTokenHash.
type MintOption func(*mintOptions)

type mintOptions struct {
	ttl    time.Duration
	hasTTL bool
}

// WithTTL makes the token expire ttl after it is stored (its CreatedAt, at
// the store's clock). Without it a token never expires.
func WithTTL(ttl time.Duration) MintOption {
	return func(o *mintOptions) { o.ttl, o.hasTTL = ttl, true }
}

func buildMintOptions(opts []MintOption) (mintOptions, error) {
	var o mintOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.hasTTL {
		if err := CheckTTL(o.ttl); err != nil {
			return o, err
		}
	}
	return o, nil
}

// expiresAt is when a token stored at created expires; zero without a TTL.
func (o mintOptions) expiresAt(created time.Time) time.Time {
	if !o.hasTTL {
		return time.Time{}
	}
	return normTime(created.Add(o.ttl))
}

// How a Runner authenticated when it enrolled; the same strings as
// verifier.Subject.Method.
const (
	MethodProjected = "projected"
	MethodMinted    = "minted"
)

// Enrollment is one successful Enroll call.
type Enrollment struct {
	RunnerID string
	Method   string // MethodProjected or MethodMinted
	// From a projected token's kubernetes.io claims; empty for minted tokens.
	Cluster  string
	NodeName string
	NodeUID  string
	PodName  string
	PodUID   string
	// What the Runner reported of itself: informational, unauthenticated,
	// printable text of at most MaxReportedLen bytes (empty when not sent).
	Version  string
	Hostname string
	At       time.Time // zero: the store's clock
}

// EnrollResult says what RecordEnrollment found.
type EnrollResult struct {
	// FirstEnrollment: the Runner ID was not known before.
	FirstEnrollment bool
	// NodeUIDChanged: the previous enrollment and this one both carried a
	// node UID, and they differ: the node was rebuilt under the same name.
	NodeUIDChanged  bool
	PreviousNodeUID string
}

// Runner is one enrolled Runner as the registry knows it.
type Runner struct {
	ID              string
	Tenant          string
	Method          string
	Cluster         string
	NodeName        string
	NodeUID         string
	PodName         string
	PodUID          string
	Version         string // as reported at the latest enrollment
	Hostname        string // as reported at the latest enrollment
	FirstEnrolledAt time.Time
	LastEnrolledAt  time.Time
	LastSeenAt      time.Time // zero until the Runner's first event
}

// Option configures a Store.
type Option func(*options)

type options struct {
	now func() time.Time
	// migrateUpTo, when positive, stops migrations after that version: the
	// tests' way to build a database as an older release left it.
	migrateUpTo int
	readOnly    bool
}

// ReadOnly opens the store for reading only, as compass-callout opens it:
// SQLite with mode=ro (SQLite refuses every write on the connection, and
// never creates the file), PostgreSQL with default_transaction_read_only on
// for every session. Every write method then fails; an opener that would
// migrate refuses the option. What binds a compromised reader is outside
// the process: on PostgreSQL a role granted only SELECT (docs/store.md,
// "compass-callout's read-only role"), on SQLite the file's mount.
func ReadOnly() Option {
	return func(o *options) { o.readOnly = true }
}

// WithClock sets the clock the store stamps created, revoked, enrolled and
// migration times with. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

func buildOptions(opts []Option) options {
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// timeResolution is what both backends keep of a time: PostgreSQL's
// timestamptz has microseconds, so SQLite stores the same.
const timeResolution = time.Microsecond

// normTime is how a time is stored: UTC, to the microsecond.
func normTime(t time.Time) time.Time { return t.UTC().Truncate(timeResolution) }

// publicIDBytes is the randomness of a token's public ID: 64 bits keeps IDs
// short enough to type and collisions (a unique-index failure) negligible.
const publicIDBytes = 8

func newPublicID() (string, error) {
	var b [publicIDBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("store: generate token ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// checkStoredToken validates a token, subject and options before
// StoreTokenHash. Its errors never quote the token.
func checkStoredToken(token string, kind verifier.SubjectKind, id string, opts []MintOption) (mintOptions, error) {
	if err := verifier.CheckMintedToken(token); err != nil {
		return mintOptions{}, fmt.Errorf("store: %w", err)
	}
	if len(token) < MinStoredTokenBytes {
		return mintOptions{}, fmt.Errorf("store: %w: token shorter than %d bytes", verifier.ErrInvalidArgument, MinStoredTokenBytes)
	}
	if err := verifier.CheckSubjectID(kind, id); err != nil {
		return mintOptions{}, fmt.Errorf("store: %w", err)
	}
	return buildMintOptions(opts)
}

// mint is Mint on top of a backend's StoreTokenHash.
func mint(ctx context.Context, st interface {
	StoreTokenHash(context.Context, string, verifier.SubjectKind, string, ...MintOption) (TokenInfo, error)
}, kind verifier.SubjectKind, id string, opts []MintOption) (string, TokenInfo, error) {
	if err := verifier.CheckSubjectID(kind, id); err != nil {
		return "", TokenInfo{}, fmt.Errorf("store: mint: %w", err)
	}
	if _, err := buildMintOptions(opts); err != nil {
		return "", TokenInfo{}, err
	}
	token, err := verifier.GenerateToken()
	if err != nil {
		return "", TokenInfo{}, fmt.Errorf("store: mint: %w", err)
	}
	info, err := st.StoreTokenHash(ctx, token, kind, id, opts...)
	if err != nil {
		return "", TokenInfo{}, err
	}
	return token, info, nil
}

// checkEnrollment validates an enrollment and fills in its time.
func checkEnrollment(e *Enrollment, now func() time.Time) error {
	if len(e.RunnerID) > MaxRunnerIDLen {
		return fmt.Errorf("store: %w: runner ID longer than %d bytes", verifier.ErrInvalidArgument, MaxRunnerIDLen)
	}
	if err := subjects.ValidSubjectToken(e.RunnerID); err != nil {
		return fmt.Errorf("store: %w: runner ID %q: %w", verifier.ErrInvalidArgument, e.RunnerID, err)
	}
	if e.Method != MethodProjected && e.Method != MethodMinted {
		return fmt.Errorf("store: %w: enrollment method %q is neither %q nor %q", verifier.ErrInvalidArgument, e.Method, MethodProjected, MethodMinted)
	}
	for _, f := range []struct{ name, v string }{
		{"cluster", e.Cluster}, {"node name", e.NodeName}, {"node UID", e.NodeUID},
		{"pod name", e.PodName}, {"pod UID", e.PodUID},
	} {
		if len(f.v) > MaxEnrollmentFieldLen {
			return fmt.Errorf("store: %w: %s longer than %d bytes", verifier.ErrInvalidArgument, f.name, MaxEnrollmentFieldLen)
		}
	}
	for _, f := range []struct{ name, v string }{{"version", e.Version}, {"hostname", e.Hostname}} {
		if err := CheckReported(f.v); err != nil {
			return fmt.Errorf("store: %w: %s: %w", verifier.ErrInvalidArgument, f.name, err)
		}
	}
	if e.At.IsZero() {
		e.At = now()
	}
	e.At = normTime(e.At)
	return nil
}

// CheckReported checks a string a Runner reports of itself (version,
// hostname): at most MaxReportedLen bytes of printable UTF-8. Operators read
// these in terminals, so a control character (an escape sequence) is refused,
// not stored.
func CheckReported(v string) error {
	if len(v) > MaxReportedLen {
		return fmt.Errorf("longer than %d bytes", MaxReportedLen)
	}
	if !utf8.ValidString(v) {
		return errors.New("not UTF-8")
	}
	if i := strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }); i >= 0 {
		return fmt.Errorf("unprintable character at byte %d", i)
	}
	return nil
}

// nodeUIDChanged is the rebuilt-node rule: both enrollments carried a node
// UID and they differ.
func nodeUIDChanged(prev, cur string) bool { return prev != "" && cur != "" && prev != cur }
