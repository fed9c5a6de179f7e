// Package runner is the Compass Runner: it reads its token (a static minted
// token or a projected ServiceAccount token file re-read on every use),
// enrolls over the Server's door, keeps a NATS connection authorized with the
// same token across rotations, and serves commands on its own subject.
package runner

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// TokenSource yields the bearer token for the next call. It is asked on every
// RPC and every NATS CONNECT, so a rotated token is used as soon as it exists.
type TokenSource interface {
	Token() (string, error)
}

// Errors of the token sources.
var (
	// ErrNoToken: neither a token nor a token file was configured, or the
	// configured token is empty.
	ErrNoToken = errors.New("runner: no token configured")
	// ErrBothTokens: COMPASS_RUNNER_TOKEN and a token file were both set.
	ErrBothTokens = errors.New("runner: COMPASS_RUNNER_TOKEN and --token-file/COMPASS_RUNNER_TOKEN_FILE are mutually exclusive")
	// ErrTokenUnavailable: the token file cannot be read (or is empty) and no
	// unexpired last good token is left to fall back on.
	ErrTokenUnavailable = errors.New("runner: token unavailable")
)

// StaticToken is a fixed token ($COMPASS_RUNNER_TOKEN), typically a minted
// Runner token.
type StaticToken string

// Token returns the token, or ErrNoToken when it is empty.
func (s StaticToken) Token() (string, error) {
	t := strings.TrimSpace(string(s))
	if t == "" {
		return "", ErrNoToken
	}
	return t, nil
}

// Expiry is the token's exp claim, read unverified, when it is a JWT.
func (s StaticToken) Expiry() (time.Time, bool) { return TokenExpiry(strings.TrimSpace(string(s))) }

// Expirer is implemented by token sources that know when their current token
// expires (read unverified from the JWT; a minted opaque token has none).
type Expirer interface {
	Expiry() (time.Time, bool)
}

// FileToken reads a token from a file on every call: a projected
// ServiceAccount token the kubelet replaces atomically at about 80 % of its
// lifetime. No watcher is needed for correctness.
//
// On a read error (or an empty file) it logs the cause, never the token, and
// returns the last good token while that token's exp (read unverified) is in
// the future; a token with no exp is not reused. Then it fails with
// ErrTokenUnavailable.
type FileToken struct {
	path string
	log  *slog.Logger
	now  func() time.Time

	mu      sync.Mutex
	last    string    // last token read successfully
	lastExp time.Time // its exp; zero when it has none
	failing bool      // the last read failed (logs transitions only)
	expired bool      // the fallback ended (logged once)
}

// NewFileToken returns a FileToken for path. log and now default to
// slog.Default() and time.Now.
func NewFileToken(path string, log *slog.Logger, now func() time.Time) *FileToken {
	if log == nil {
		log = slog.Default()
	}
	if now == nil {
		now = time.Now
	}
	return &FileToken{path: path, log: log, now: now}
}

// Path is the token file's path.
func (f *FileToken) Path() string { return f.path }

// Token re-reads the file and returns its trimmed content, or falls back to
// the last good token while it is unexpired.
func (f *FileToken) Token() (string, error) {
	data, err := os.ReadFile(f.path)
	tok := strings.TrimSpace(string(data))
	if err == nil && tok == "" {
		err = errors.New("file is empty")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		if f.failing {
			f.log.Info("runner: token file readable again", "path", f.path)
		}
		f.failing, f.expired = false, false
		if tok != f.last {
			f.last = tok
			f.lastExp, _ = TokenExpiry(tok)
		}
		return tok, nil
	}
	now := f.now()
	if f.last != "" && !f.lastExp.IsZero() && now.Before(f.lastExp) {
		if !f.failing {
			f.log.Warn("runner: token file unreadable; using the last good token until it expires",
				"path", f.path, "err", err, "expires", f.lastExp.UTC().Format(time.RFC3339), "left", f.lastExp.Sub(now).Round(time.Second))
		}
		f.failing = true
		return f.last, nil
	}
	reason := "no earlier token"
	switch {
	case f.last != "" && f.lastExp.IsZero():
		reason = "the last good token has no exp, so it is not reused"
	case f.last != "":
		reason = "the last good token expired at " + f.lastExp.UTC().Format(time.RFC3339)
	}
	if !f.expired {
		f.log.Error("runner: token file unreadable and no usable token left; calls are unauthenticated until the file is readable",
			"path", f.path, "err", err, "reason", reason)
	}
	f.failing, f.expired = true, true
	return "", fmt.Errorf("%w: token file %s: %w (%s)", ErrTokenUnavailable, f.path, err, reason)
}

// Expiry is the exp of the last good token (zero, false when none or opaque).
func (f *FileToken) Expiry() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastExp, !f.lastExp.IsZero()
}

// TokenExpiry reads the exp claim of a compact JWT without verifying it. It
// reports false for anything that is not a JWT with a numeric exp.
func TokenExpiry(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var c struct {
		Exp *json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &c); err != nil || c.Exp == nil {
		return time.Time{}, false
	}
	sec, err := c.Exp.Float64()
	if err != nil || sec <= 0 {
		return time.Time{}, false
	}
	return time.Unix(int64(sec), 0), true
}

// NewTokenSource picks the token source from the configuration: exactly one of
// a static token and a token file. Both set is ErrBothTokens, neither is
// ErrNoToken.
func NewTokenSource(static, file string, log *slog.Logger, now func() time.Time) (TokenSource, error) {
	static = strings.TrimSpace(static)
	switch {
	case static != "" && file != "":
		return nil, ErrBothTokens
	case file != "":
		return NewFileToken(file, log, now), nil
	case static != "":
		return StaticToken(static), nil
	}
	return nil, ErrNoToken
}
