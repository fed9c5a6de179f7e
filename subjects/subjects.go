// Package subjects is the NATS subject scheme of Compass Runners and the
// permissions a Runner's user JWT carries. It is pure: no I/O, no state, and
// only the standard library, so the verifier can import it.
//
// For a Runner ID such as "prod-eks/ip-10-0-1-5_ec2_internal" (one subject token):
//
//	compass.runner.<id>.cmd      the Server publishes requests; the Runner subscribes
//	compass.runner.<id>.evt.>    the Runner publishes; the Server subscribes
//	compass.runner.<id>.inbox.>  replies to the Runner's own requests
package subjects

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Prefix is the first two tokens of every Runner subject.
const Prefix = "compass.runner"

// ReplyTTL bounds how long a Runner may answer a request it received. Commands
// are interactive; a minute covers a slow command without leaving a standing
// grant to publish on inboxes.
const ReplyTTL = time.Minute

var (
	ErrEmpty   = errors.New("subjects: empty subject token")
	ErrInvalid = errors.New("subjects: invalid subject token")
)

// ValidSubjectToken reports whether s can stand as one token of a NATS subject:
// non-empty valid UTF-8 without ".", "*", ">", whitespace or control characters.
func ValidSubjectToken(s string) error {
	if s == "" {
		return ErrEmpty
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalid)
	}
	for _, r := range s {
		switch {
		case r == '.' || r == '*' || r == '>':
			return fmt.Errorf("%w: contains %q", ErrInvalid, r)
		case unicode.IsSpace(r) || unicode.IsControl(r) || r == utf8.RuneError:
			return fmt.Errorf("%w: contains whitespace or a control character", ErrInvalid)
		}
	}
	return nil
}

func base(runnerID string) (string, error) {
	if err := ValidSubjectToken(runnerID); err != nil {
		return "", fmt.Errorf("runner ID: %w", err)
	}
	return Prefix + "." + runnerID, nil
}

// Command is the subject the Server sends requests to and the Runner serves.
func Command(runnerID string) (string, error) {
	b, err := base(runnerID)
	if err != nil {
		return "", err
	}
	return b + ".cmd", nil
}

// Event is the subject a Runner publishes an event of the given name on. name
// may be several tokens ("heartbeat", "container.started") but no wildcards.
func Event(runnerID, name string) (string, error) {
	b, err := base(runnerID)
	if err != nil {
		return "", err
	}
	if name == "" {
		return "", fmt.Errorf("event name: %w", ErrEmpty)
	}
	for _, tok := range strings.Split(name, ".") {
		if err := ValidSubjectToken(tok); err != nil {
			return "", fmt.Errorf("event name: %w", err)
		}
	}
	return b + ".evt." + name, nil
}

// Events is the wildcard of all of a Runner's events.
func Events(runnerID string) (string, error) {
	b, err := base(runnerID)
	if err != nil {
		return "", err
	}
	return b + ".evt.>", nil
}

// AllEvents is the wildcard the Server subscribes to for every Runner's events.
const AllEvents = Prefix + ".*.evt.>"

// InboxPrefix is the Runner's custom inbox prefix (nats.CustomInboxPrefix);
// replies to its own requests arrive under InboxPrefix + ".>".
func InboxPrefix(runnerID string) (string, error) {
	b, err := base(runnerID)
	if err != nil {
		return "", err
	}
	return b + ".inbox", nil
}

// RunnerIDFromSubject extracts the Runner ID from any Runner subject.
func RunnerIDFromSubject(subject string) (string, bool) {
	toks := strings.Split(subject, ".")
	if len(toks) < 4 || toks[0] != "compass" || toks[1] != "runner" || ValidSubjectToken(toks[2]) != nil {
		return "", false
	}
	return toks[2], true
}

// Permissions is what a Runner may do on NATS, in the scheme's terms; the
// callout turns it into a user JWT's permissions.
type Permissions struct {
	Publish   []string      // subjects the Runner may publish to
	Subscribe []string      // subjects the Runner may subscribe to
	ReplyMax  int           // answers allowed to each request it received
	ReplyTTL  time.Duration // within this long
}

// RunnerPermissions is exactly what a Runner's user JWT allows: subscribe to its
// cmd subject and its inbox, publish its events, and answer one message to each
// request it received within ReplyTTL. Everything else is denied by omission.
func RunnerPermissions(runnerID string) (Permissions, error) {
	cmd, err := Command(runnerID)
	if err != nil {
		return Permissions{}, err
	}
	evt, _ := Events(runnerID)
	inbox, _ := InboxPrefix(runnerID)
	return Permissions{
		Publish:   []string{evt},
		Subscribe: []string{cmd, inbox + ".>"},
		ReplyMax:  1,
		ReplyTTL:  ReplyTTL,
	}, nil
}
