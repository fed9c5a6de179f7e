package tokenreview

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"
)

// Review asks whether token is still accepted. notAfter is when the caller
// stops accepting it anyway (its exp plus leeway): an accepted or rejected
// answer is cached under the token's SHA-256 until then (a rejected token
// never becomes valid again), an accepted one for at most MaxAcceptedAge; an
// unavailable one is not cached, nor is any answer when notAfter is not after
// now. Concurrent Reviews of one token send one request; a Review whose ctx
// ends returns at once, and the request is cancelled when no Review waits
// for it any more. The token itself is never logged, never in an error,
// never a cache key in clear.
//
// The error satisfies errors.Is with exactly one of ErrRejected and
// ErrUnavailable (and, when ctx ended, with ctx's error too).
func (r *Reviewer) Review(ctx context.Context, token string, notAfter time.Time) (Result, error) {
	start := r.now()
	res, cached, err := r.review(ctx, token, notAfter)
	ev := Event{Outcome: OutcomeAccepted, Cached: cached, Duration: r.now().Sub(start)}
	switch {
	case errors.Is(err, ErrRejected):
		ev.Outcome = OutcomeRejected
	case err != nil:
		ev.Outcome = OutcomeUnavailable
	}
	r.observe(ev)
	return res, err
}

// flight is one request and the Reviews waiting for it.
type flight struct {
	done    chan struct{} // closed when res and err are set
	res     Result
	err     error
	waiters int                // guarded by Reviewer.mu
	cancel  context.CancelFunc // ends the request
}

func (r *Reviewer) review(ctx context.Context, token string, notAfter time.Time) (_ Result, cached bool, _ error) {
	// Before any work: the verifier's cap, and the API server's own refusal
	// of an empty token (400), answered here without a request.
	if token == "" {
		return Result{}, false, fmt.Errorf("%w: empty token", ErrRejected)
	}
	if len(token) > MaxTokenBytes {
		return Result{}, false, fmt.Errorf("%w: token longer than MaxTokenBytes (%d)", ErrRejected, MaxTokenBytes)
	}
	key := sha256.Sum256([]byte(token))

	r.mu.Lock()
	if e, ok := r.cache.get(key, r.now()); ok {
		r.mu.Unlock()
		return e.res, true, e.err
	}
	if err := ctx.Err(); err != nil {
		r.mu.Unlock()
		return Result{}, false, fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
	}
	f := r.flights[key]
	if f == nil {
		// The request is shared, so no one caller's cancellation may end it:
		// it keeps ctx's values, not its cancellation, and ends at
		// RequestTimeout or when its last waiter leaves (below).
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RequestTimeout)
		f = &flight{done: make(chan struct{}), cancel: cancel}
		r.flights[key] = f
		go r.fly(fctx, f, key, token, notAfter)
	}
	f.waiters++
	r.mu.Unlock()

	select {
	case <-f.done:
		return f.res, false, f.err
	case <-ctx.Done():
	}
	r.mu.Lock()
	f.waiters--
	if f.waiters == 0 && r.flights[key] == f {
		delete(r.flights, key)
		f.cancel()
	}
	r.mu.Unlock()
	select {
	case <-f.done: // answered as ctx ended: the answer is worth more
		return f.res, false, f.err
	default:
		return Result{}, false, fmt.Errorf("%w: %w", ErrUnavailable, context.Cause(ctx))
	}
}

// fly sends f's request and caches its answer.
func (r *Reviewer) fly(ctx context.Context, f *flight, key [sha256.Size]byte, token string, notAfter time.Time) {
	defer f.cancel()
	asked := r.now()
	res, err := r.request(ctx, token)
	r.mu.Lock()
	if r.flights[key] == f {
		delete(r.flights, key)
	}
	switch {
	case err == nil:
		// From the moment it was asked: the answer may describe the pod as
		// it was then.
		r.cache.put(key, res, nil, minTime(notAfter, asked.Add(MaxAcceptedAge)), r.now())
	case errors.Is(err, ErrRejected):
		r.cache.put(key, Result{}, err, notAfter, r.now())
	}
	f.res, f.err = res, err
	r.mu.Unlock()
	close(f.done)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// The TokenReview object, authentication.k8s.io/v1: the fields this package
// sends and reads, and no more (no Kubernetes client in the daemons).
const (
	apiVersion = "authentication.k8s.io/v1"
	kind       = "TokenReview"

	// The user extras a pod-bound ServiceAccount token is authenticated with.
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

type reviewRequest struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Spec       requestSpec `json:"spec"`
}

type requestSpec struct {
	Token     string   `json:"token"`
	Audiences []string `json:"audiences"`
}

// reviewAnswer is the answer's type and status; its spec, which echoes the
// token, is not decoded. The status is decoded once the type is known.
type reviewAnswer struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Status     json.RawMessage `json:"status"`
}

type reviewStatus struct {
	Authenticated bool `json:"authenticated"`
	User          struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"user"`
	Audiences []string `json:"audiences"`
	Error     string   `json:"error"`
}

// request sends one TokenReview and reads its answer.
func (r *Reviewer) request(ctx context.Context, token string) (Result, error) {
	bearer, err := r.cred.Token()
	if err != nil {
		return Result{}, fmt.Errorf("%w: the reviewer's token file: %w", ErrUnavailable, err)
	}
	body, err := json.Marshal(reviewRequest{APIVersion: apiVersion, Kind: kind,
		Spec: requestSpec{Token: token, Audiences: []string{r.audience}}})
	if err != nil {
		return Result{}, fmt.Errorf("%w: encode the request", ErrUnavailable) // a string and a list of one: not reached
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.endpoint, bytes.NewReader(body))
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		// A *url.Error: the method, the endpoint and the cause, none of
		// which holds the token (it is in the body).
		return Result{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return Result{}, fmt.Errorf("%w: reading the answer: %w", ErrUnavailable, err)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusOK || code == http.StatusCreated:
	case code == http.StatusUnauthorized:
		return Result{}, fmt.Errorf("%w: the API server refused the reviewer's own token (401 Unauthorized)", ErrUnavailable)
	case code == http.StatusForbidden:
		return Result{}, fmt.Errorf("%w: the reviewer may not create tokenreviews (403 Forbidden): see the package's RBAC", ErrUnavailable)
	case code >= 300 && code < 400:
		return Result{}, fmt.Errorf("%w: status %d %s: redirects are not followed", ErrUnavailable, code, http.StatusText(code))
	default:
		// Status text from the table, not the server's reason phrase.
		return Result{}, fmt.Errorf("%w: status %d %s", ErrUnavailable, code, http.StatusText(code))
	}
	if len(data) > MaxResponseBytes {
		return Result{}, fmt.Errorf("%w: answer longer than MaxResponseBytes (%d)", ErrUnavailable, MaxResponseBytes)
	}
	return parse(data, r.audience, r.username, token)
}

// parse reads a TokenReview answer: accepted only when status.authenticated
// is true, status.audiences holds audience, status.user.username is exactly
// username, and the pod-name and pod-uid extras hold one non-empty value
// each. token is used only to keep it out of the error.
func parse(data []byte, audience, username, token string) (Result, error) {
	var a reviewAnswer
	if err := json.Unmarshal(data, &a); err != nil {
		// Not wrapped: a JSON error may quote the input, which echoes the token.
		return Result{}, fmt.Errorf("%w: the answer is not JSON", ErrUnavailable)
	}
	if a.APIVersion != apiVersion || a.Kind != kind {
		return Result{}, fmt.Errorf("%w: the answer is not an %s %s", ErrUnavailable, apiVersion, kind)
	}
	var st reviewStatus
	if len(a.Status) == 0 || string(a.Status) == "null" || json.Unmarshal(a.Status, &st) != nil {
		return Result{}, fmt.Errorf("%w: the answer's status is not a TokenReviewStatus", ErrUnavailable)
	}
	if !st.Authenticated {
		if st.Error == "" {
			return Result{}, fmt.Errorf("%w: not authenticated", ErrRejected)
		}
		return Result{}, fmt.Errorf("%w: not authenticated: %q", ErrRejected, quotable(st.Error, token))
	}
	if !slices.Contains(st.Audiences, audience) {
		return Result{}, fmt.Errorf("%w: authenticated for audiences %q, not %q", ErrRejected, quotableList(st.Audiences, token), audience)
	}
	if st.User.Username != username {
		return Result{}, fmt.Errorf("%w: authenticated as %q, not %s", ErrRejected, quotable(st.User.Username, token), username)
	}
	names, uids := st.User.Extra[extraPodName], st.User.Extra[extraPodUID]
	if len(names) != 1 || len(uids) != 1 || names[0] == "" || uids[0] == "" {
		return Result{}, fmt.Errorf("%w: not bound to one pod (%d pod names, %d pod UIDs)", ErrRejected, len(names), len(uids))
	}
	return Result{PodName: names[0], PodUID: uids[0]}, nil
}

// quotable makes text from the API server fit for an error message: without
// control or other unprintable characters (newlines, bidirectional
// overrides), at most maxErrorText bytes, and withheld entirely if it could
// be quoting the token (kube-apiserver's messages do not, but this does not
// rely on it): if it holds the token's last 32 bytes, or the whole token when
// shorter, which any quotation of a whole token or of its signature would.
func quotable(s, token string) string {
	tail := token
	if len(tail) > 32 {
		tail = tail[len(tail)-32:]
	}
	if tail != "" && strings.Contains(s, tail) {
		return "(withheld: it quotes the token)"
	}
	var b strings.Builder
	for _, c := range s {
		switch {
		case unicode.IsSpace(c):
			c = ' '
		case !unicode.IsPrint(c):
			continue
		}
		if b.Len()+len(string(c)) > maxErrorText {
			b.WriteString("...")
			break
		}
		b.WriteRune(c)
	}
	return b.String()
}

func quotableList(list []string, token string) []string {
	const maxItems = 8 // an API server answers with the one audience asked for
	out := make([]string, 0, min(len(list), maxItems))
	for i, s := range list {
		if i == maxItems {
			out = append(out, "...")
			break
		}
		out = append(out, quotable(s, token))
	}
	return out
}
