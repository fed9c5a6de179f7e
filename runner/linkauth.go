package runner

import (
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// slowAuthErr is nats.go's error (v1.55, sendConnect) when the first line the
// server sends after the client's CONNECT and PING is neither PONG nor -ERR.
// Against nats-server that line is the server's first PING, sent 2 s (plus up
// to 20 %) after the CONNECT while the auth callout has not answered yet.
// nats.go exports no value for it and does not wrap it, so it is matched by
// its text; test/horizon and TestLinkCountsSlowAuthApartFromRefusals run the
// real server, so an upgrade that changes the text fails them.
const slowAuthErr = "nats: expected 'PONG', got 'PING'"

// IsSlowAuth reports whether err (or an error it wraps, by text) is a CONNECT
// that failed because the server's first PING came before its authorization
// answer: the callout (or the server's queue in front of it) was too slow,
// which is not a refusal. The Runner retries it on its reconnect backoff.
func IsSlowAuth(err error) bool {
	return err != nil && strings.Contains(err.Error(), slowAuthErr)
}

// slowAuth counts, logs (at most once per authLogEvery) and reports a CONNECT
// that failed with IsSlowAuth. retryIn is the backoff before the next
// attempt, when known.
func (l *Link) slowAuth(s *session, err error, retryIn time.Duration) {
	n := l.slowAuths.Add(1)
	now := l.cfg.Now()
	l.authMu.Lock()
	if l.lastSlowLog.IsZero() || now.Sub(l.lastSlowLog) >= authLogEvery {
		l.lastSlowLog = now
		attrs := []any{"session", s.id, "err", err, "slow_auths", n}
		if retryIn > 0 {
			attrs = append(attrs, "retry_in", retryIn.Round(time.Millisecond))
		}
		l.log.Warn("runner: NATS CONNECT not authorized in time: the server's first PING, about 2 s after the CONNECT, came before the auth callout's answer (the callout or the server is slow or overloaded; this is not a refusal); retrying on the reconnect backoff", attrs...)
	}
	l.authMu.Unlock()
	l.emit(EventSlowAuth, s, err)
}

func isAuthErr(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// explainAuth logs why the server refused the Runner, in the Runner's terms.
func (l *Link) explainAuth(s *session, err error) {
	now := l.cfg.Now()
	if errors.Is(err, nats.ErrAuthExpired) {
		// The server ended the user JWT's lifetime; nats.go reconnects with
		// the current token. Learn the lifetime so the next one is replaced
		// before it ends - unless the token's own exp explains the expiry
		// (the callout never outlives the token), which says nothing about
		// the callout's cap and would make a short-lived lesson stick.
		byToken := false
		if sent := s.sent.Load(); sent != nil {
			if exp, ok := TokenExpiry(*sent); ok && !exp.After(now.Add(tokenExpirySlack)) {
				byToken = true
			}
		}
		if at := s.connectedAt.Load(); at > 0 && !byToken {
			life := now.Sub(time.Unix(0, at))
			if life > time.Second && (l.learned.Load() == 0 || int64(life) < l.learned.Load()) {
				l.learned.Store(int64(life))
			}
		}
		l.log.Info("runner: NATS user authorization expired; reconnecting with the current token", "session", s.id)
		l.emit(EventAuthError, s, err)
		return
	}
	l.authRefusals.Add(1)
	msg := "runner: NATS refused authorization: the server or its auth callout rejected the token (not registered, revoked, wrong audience, or the issuer's keys are unavailable)"
	attrs := []any{"session", s.id, "err", err}
	tok, terr := l.cfg.Tokens.Token()
	switch {
	case terr != nil:
		msg = "runner: NATS refused authorization: the Runner has no usable token"
		attrs = append(attrs, "token_err", terr)
	default:
		if exp, ok := TokenExpiry(tok); ok {
			attrs = append(attrs, "token_expires", exp.UTC().Format(time.RFC3339))
			if !now.Before(exp) {
				msg = "runner: NATS refused authorization: the token expired and was not replaced"
			}
		}
		if f, ok := l.cfg.Tokens.(*FileToken); ok {
			attrs = append(attrs, "token_file", f.Path())
		}
	}
	// Log first, then emit: whoever watches the events finds the explanation
	// already in the log.
	l.authMu.Lock()
	if msg != l.lastAuthMsg || now.Sub(l.lastAuthLog) >= authLogEvery {
		l.lastAuthMsg, l.lastAuthLog = msg, now
		l.log.Error(msg, attrs...)
	}
	l.authMu.Unlock()
	l.emit(EventAuthError, s, err)
}
