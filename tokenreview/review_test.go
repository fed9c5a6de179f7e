package tokenreview_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/tokenreview"
)

// Every answer the API server can give, and what Review makes of it: exact
// errors, and never the token in one.
func TestReviewAnswers(t *testing.T) {
	const token = "eyJhbGciOiJSUzI1NiIsImtpZCI6ImsxIn0.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6Y29tcGFzcy1ydW5uZXI6Y29tcGFzcy1ydW5uZXIifQ.c2lnbmF0dXJlLW9mLXRoZS1ydW5uZXItdG9rZW4tMTIzNDU2Nzg5MA"
	review := func(code int, status string) func(http.ResponseWriter, *http.Request, string) {
		return func(w http.ResponseWriter, _ *http.Request, tok string) { writeReview(w, code, tok, status) }
	}
	raw := func(code int, body string) func(http.ResponseWriter, *http.Request, string) {
		return func(w http.ResponseWriter, _ *http.Request, _ string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			_, _ = io.WriteString(w, body)
		}
	}
	authed := func(user, audiences, extra string) string {
		return `{"authenticated":true,"user":{"username":"` + user + `","extra":{` + extra + `}},"audiences":` + audiences + `}`
	}
	const pod = `"authentication.kubernetes.io/pod-name":["` + podName + `"],"authentication.kubernetes.io/pod-uid":["` + podUID + `"]`
	long := strings.Repeat("x", 300)
	tests := []struct {
		name    string
		answer  func(http.ResponseWriter, *http.Request, string)
		want    tokenreview.Result
		wantIs  error // nil: accepted
		wantMsg string
	}{
		{name: "accepted (201 Created, as kube-apiserver answers)", answer: review(http.StatusCreated, acceptedStatus),
			want: tokenreview.Result{PodName: podName, PodUID: podUID}},
		{name: "accepted (200 OK)", answer: review(http.StatusOK, authed(runnerUser, `["compass-runner"]`, pod)),
			want: tokenreview.Result{PodName: podName, PodUID: podUID}},
		{name: "pod deleted", answer: review(http.StatusCreated, deletedPodStatus), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not authenticated: "[invalid bearer token, service account token has been invalidated]"`},
		{name: "not authenticated, no error text", answer: review(http.StatusCreated, `{"authenticated":false}`), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not authenticated`},
		{name: "error text quoting the token is withheld", answer: review(http.StatusCreated, `{"error":"bad token `+token+`"}`), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not authenticated: "(withheld: it quotes the token)"`},
		{name: "error text quoting the signature is withheld", answer: review(http.StatusCreated, `{"error":"bad signature `+token[len(token)-40:]+`"}`), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not authenticated: "(withheld: it quotes the token)"`},
		{name: "error text without control characters", answer: review(http.StatusCreated, `{"error":"line one\nline two\u202e\u0007 end"}`), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not authenticated: "line one line two end"`},
		{name: "error text capped", answer: review(http.StatusCreated, `{"error":"`+long+`"}`), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not authenticated: "` + long[:256] + `..."`},
		{name: "another audience", answer: review(http.StatusCreated, authed(runnerUser, `["vault"]`, pod)), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: authenticated for audiences ["vault"], not "compass-runner"`},
		{name: "no audiences in the answer", answer: review(http.StatusCreated, authed(runnerUser, `[]`, pod)), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: authenticated for audiences [], not "compass-runner"`},
		{name: "another ServiceAccount", answer: review(http.StatusCreated, authed("system:serviceaccount:compass-runner:other", `["compass-runner"]`, pod)), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: authenticated as "system:serviceaccount:compass-runner:other", not system:serviceaccount:compass-runner:compass-runner`},
		{name: "the ServiceAccount's name in another namespace", answer: review(http.StatusCreated, authed("system:serviceaccount:default:compass-runner", `["compass-runner"]`, pod)), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: authenticated as "system:serviceaccount:default:compass-runner", not system:serviceaccount:compass-runner:compass-runner`},
		{name: "a user, not a ServiceAccount", answer: review(http.StatusCreated, authed("compass-runner", `["compass-runner"]`, pod)), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: authenticated as "compass-runner", not system:serviceaccount:compass-runner:compass-runner`},
		{name: "bound to no pod", answer: review(http.StatusCreated, authed(runnerUser, `["compass-runner"]`, "")), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not bound to one pod (0 pod names, 0 pod UIDs)`},
		{name: "two pod names", answer: review(http.StatusCreated, authed(runnerUser, `["compass-runner"]`,
			`"authentication.kubernetes.io/pod-name":["a","b"],"authentication.kubernetes.io/pod-uid":["u"]`)), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not bound to one pod (2 pod names, 1 pod UIDs)`},
		{name: "an empty pod UID", answer: review(http.StatusCreated, authed(runnerUser, `["compass-runner"]`,
			`"authentication.kubernetes.io/pod-name":["a"],"authentication.kubernetes.io/pod-uid":[""]`)), wantIs: tokenreview.ErrRejected,
			wantMsg: `tokenreview: token rejected: not bound to one pod (1 pod names, 1 pod UIDs)`},
		{name: "malformed JSON", answer: raw(http.StatusCreated, `{"kind":"TokenReview",`), wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: the answer is not JSON`},
		{name: "an empty object", answer: raw(http.StatusOK, `{}`), wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: the answer is not an authentication.k8s.io/v1 TokenReview`},
		{name: "another apiVersion", answer: raw(http.StatusCreated, `{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1beta1","status":{"authenticated":false}}`),
			wantIs: tokenreview.ErrUnavailable, wantMsg: `tokenreview: API server unavailable: the answer is not an authentication.k8s.io/v1 TokenReview`},
		{name: "a Status with 200", answer: raw(http.StatusOK, `{"kind":"Status","apiVersion":"v1","status":"Failure"}`), wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: the answer is not an authentication.k8s.io/v1 TokenReview`},
		{name: "a TokenReview without status", answer: raw(http.StatusCreated, `{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","spec":{}}`),
			wantIs: tokenreview.ErrUnavailable, wantMsg: `tokenreview: API server unavailable: the answer's status is not a TokenReviewStatus`},
		{name: "a TokenReview with a null status", answer: raw(http.StatusCreated, `{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","status":null}`),
			wantIs: tokenreview.ErrUnavailable, wantMsg: `tokenreview: API server unavailable: the answer's status is not a TokenReviewStatus`},
		{name: "a TokenReview whose status is a string", answer: raw(http.StatusCreated, `{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","status":"Success"}`),
			wantIs: tokenreview.ErrUnavailable, wantMsg: `tokenreview: API server unavailable: the answer's status is not a TokenReviewStatus`},
		{name: "oversized answer", answer: review(http.StatusCreated, `{"error":"`+strings.Repeat("x", tokenreview.MaxResponseBytes)+`"}`), wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: answer longer than MaxResponseBytes (65536)`},
		{name: "the reviewer's token refused", answer: raw(http.StatusUnauthorized, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Unauthorized","code":401}`),
			wantIs: tokenreview.ErrUnavailable, wantMsg: `tokenreview: API server unavailable: the API server refused the reviewer's own token (401 Unauthorized)`},
		{name: "the reviewer without RBAC", answer: raw(http.StatusForbidden, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`),
			wantIs: tokenreview.ErrUnavailable, wantMsg: `tokenreview: API server unavailable: the reviewer may not create tokenreviews (403 Forbidden): see the package's RBAC`},
		{name: "500", answer: raw(http.StatusInternalServerError, `{}`), wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: status 500 Internal Server Error`},
		{name: "503", answer: byToken, wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: status 503 Service Unavailable`},
		{name: "429", answer: raw(http.StatusTooManyRequests, `{}`), wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: status 429 Too Many Requests`},
		{name: "400", answer: raw(http.StatusBadRequest, `{}`), wantIs: tokenreview.ErrUnavailable,
			wantMsg: `tokenreview: API server unavailable: status 400 Bad Request`},
	}
	f := newFakeAPI(t)
	r := f.reviewer(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f.setAnswer(tc.answer)
			got, err := r.Review(t.Context(), token, time.Time{}) // nothing cached
			checkErr(t, err, tc.wantIs, tc.wantMsg)
			if got != tc.want {
				t.Errorf("Result = %+v, want %+v", got, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), token[len(token)-16:]) {
				t.Errorf("error quotes the token: %v", err)
			}
		})
	}
}

// checkErr asserts err is exactly the sentinel is (nil: no error) with
// message msg, and not the other sentinel.
func checkErr(t *testing.T, err, is error, msg string) {
	t.Helper()
	if is == nil {
		if err != nil {
			t.Fatalf("error = %v, want none", err)
		}
		return
	}
	if !errors.Is(err, is) {
		t.Fatalf("error = %v, want errors.Is %v", err, is)
	}
	other := tokenreview.ErrRejected
	if is == tokenreview.ErrRejected {
		other = tokenreview.ErrUnavailable
	}
	if errors.Is(err, other) {
		t.Errorf("error %v is also %v", err, other)
	}
	if err.Error() != msg {
		t.Errorf("error = %q\n        want %q", err, msg)
	}
}

// The request is a TokenReview for the configured audience, POSTed below the
// server's path with the reviewer's bearer token.
func TestReviewRequest(t *testing.T) {
	f := newFakeAPI(t)
	type seen struct {
		method, path, auth, contentType string
	}
	got := make(chan seen, 1)
	f.setAnswer(func(w http.ResponseWriter, req *http.Request, tok string) {
		got <- seen{method: req.Method, path: req.URL.Path, auth: req.Header.Get("Authorization"), contentType: req.Header.Get("Content-Type")}
		writeReview(w, http.StatusCreated, tok, acceptedStatus)
	})
	cfg := f.config()
	cfg.Server += "/k8s/clusters/c-1/" // an API server behind a proxy's prefix
	r, err := tokenreview.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Review(t.Context(), "ok-1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	s := <-got
	want := seen{method: http.MethodPost, path: "/k8s/clusters/c-1/apis/authentication.k8s.io/v1/tokenreviews",
		auth: "Bearer reviewer-token-1", contentType: "application/json"}
	if s.method != want.method || s.path != want.path || s.auth != want.auth || s.contentType != want.contentType {
		t.Errorf("request = %+v, want %+v", s, want)
	}
	const wantBody = `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"ok-1","audiences":["compass-runner"]}}`
	f.mu.Lock()
	body := string(f.lastBody)
	f.mu.Unlock()
	if body != wantBody {
		t.Errorf("body = %s\n want %s", body, wantBody)
	}
}

// An empty token, and one over the verifier's cap, are rejected without a
// request; one at the cap is sent.
func TestReviewRefusesWithoutARequest(t *testing.T) {
	f := newFakeAPI(t)
	r := f.reviewer(t)
	tests := []struct {
		name     string
		token    string
		requests int64
		wantIs   error
		wantMsg  string
	}{
		{"empty", "", 0, tokenreview.ErrRejected, "tokenreview: token rejected: empty token"},
		{"over MaxTokenBytes", "ok-" + strings.Repeat("a", tokenreview.MaxTokenBytes-2), 0, tokenreview.ErrRejected,
			"tokenreview: token rejected: token longer than MaxTokenBytes (16384)"},
		{"at MaxTokenBytes", "ok-" + strings.Repeat("a", tokenreview.MaxTokenBytes-3), 1, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := f.requests.Load()
			_, err := r.Review(t.Context(), tc.token, time.Time{})
			checkErr(t, err, tc.wantIs, tc.wantMsg)
			if n := f.requests.Load() - before; n != tc.requests {
				t.Errorf("%d requests, want %d", n, tc.requests)
			}
		})
	}
}

// Config errors name the field; all of them are reported at once.
func TestNewConfig(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	empty := write("empty", "\n")
	notPEM := write("not-pem", "not a certificate")
	badToken := write("bad-token", "two words\n")
	missing := filepath.Join(dir, "missing")
	with := func(edit func(*tokenreview.Config)) tokenreview.Config {
		c := f.config()
		edit(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  tokenreview.Config
		opts []tokenreview.Option
		want string
	}{
		{"nothing set", tokenreview.Config{}, nil, strings.Join([]string{
			"tokenreview: Config.Server: required",
			"tokenreview: Config.TokenFile: required",
			"tokenreview: Config.Audience: required",
			"tokenreview: Config.Namespace: required",
			"tokenreview: Config.ServiceAccount: required",
		}, "\n")},
		{"http", with(func(c *tokenreview.Config) { c.Server = "http://10.0.0.1:6443" }), nil,
			`tokenreview: Config.Server: scheme "http", want https`},
		{"no host", with(func(c *tokenreview.Config) { c.Server = "https:///apis" }), nil,
			`tokenreview: Config.Server: no host`},
		{"credentials in the URL", with(func(c *tokenreview.Config) { c.Server = "https://admin:secret@10.0.0.1:6443" }), nil,
			`tokenreview: Config.Server: holds credentials: the reviewer's credential is Config.TokenFile`},
		{"a query", with(func(c *tokenreview.Config) { c.Server = "https://10.0.0.1:6443/?x=1" }), nil,
			`tokenreview: Config.Server: https://10.0.0.1:6443/?x=1 has a query or a fragment`},
		{"not a URL", with(func(c *tokenreview.Config) { c.Server = "https://10.0.0.1:port" }), nil,
			`tokenreview: Config.Server: not a URL`},
		{"token file missing", with(func(c *tokenreview.Config) { c.TokenFile = missing }), nil,
			"tokenreview: Config.TokenFile: stat " + missing + ": no such file or directory"},
		{"token file empty", with(func(c *tokenreview.Config) { c.TokenFile = empty }), nil,
			"tokenreview: Config.TokenFile: " + empty + " is empty"},
		{"token file with a space", with(func(c *tokenreview.Config) { c.TokenFile = badToken }), nil,
			"tokenreview: Config.TokenFile: " + badToken + " holds a character not allowed in a bearer token"},
		{"CA file missing", with(func(c *tokenreview.Config) { c.CAFile = missing }), nil,
			"tokenreview: Config.CAFile: open " + missing + ": no such file or directory"},
		{"CA file not PEM", with(func(c *tokenreview.Config) { c.CAFile = notPEM }), nil,
			"tokenreview: Config.CAFile: " + notPEM + " holds no PEM certificate"},
		{"CA file with a transport that cannot take it", f.config(), []tokenreview.Option{tokenreview.WithHTTPClient(&http.Client{Transport: roundTripper{}})},
			"tokenreview: Config.CAFile: the HTTP client's transport is not an *http.Transport"},
		{"audience with a newline", with(func(c *tokenreview.Config) { c.Audience = "compass-runner\n" }), nil,
			"tokenreview: Config.Audience: contains a control character"},
		{"namespace", with(func(c *tokenreview.Config) { c.Namespace = "Compass" }), nil,
			`tokenreview: Config.Namespace: "Compass" is not a namespace name (an RFC 1123 label)`},
		{"namespace with a dot", with(func(c *tokenreview.Config) { c.Namespace = "compass.runner" }), nil,
			`tokenreview: Config.Namespace: "compass.runner" is not a namespace name (an RFC 1123 label)`},
		{"ServiceAccount", with(func(c *tokenreview.Config) { c.ServiceAccount = "compass_runner" }), nil,
			`tokenreview: Config.ServiceAccount: "compass_runner" is not a ServiceAccount name (an RFC 1123 subdomain)`},
		{"ServiceAccount with a colon", with(func(c *tokenreview.Config) { c.ServiceAccount = "a:b" }), nil,
			`tokenreview: Config.ServiceAccount: "a:b" is not a ServiceAccount name (an RFC 1123 subdomain)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tokenreview.New(tc.cfg, tc.opts...)
			if err == nil || r != nil {
				t.Fatalf("New = %v, %v; want an error", r, err)
			}
			if err.Error() != tc.want {
				t.Errorf("error = %q\n        want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error quotes the URL's password: %v", err)
			}
		})
	}
	// Valid: the system roots (no CAFile), a ServiceAccount name with dots.
	ok := with(func(c *tokenreview.Config) { c.CAFile, c.ServiceAccount = "", "compass.runner" })
	if _, err := tokenreview.New(ok); err != nil {
		t.Errorf("New(%+v): %v", ok, err)
	}
}

type roundTripper struct{}

func (roundTripper) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("unused")
}

// Redirects are not followed: the reviewed token is in the body, which a 307
// would carry to wherever the Location points.
func TestReviewDoesNotFollowRedirects(t *testing.T) {
	elsewhere := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the redirect was followed")
	}))
	defer elsewhere.Close()
	f := newFakeAPI(t)
	f.setAnswer(func(w http.ResponseWriter, req *http.Request, _ string) {
		http.Redirect(w, req, elsewhere.URL+"/steal", http.StatusTemporaryRedirect)
	})
	_, err := f.reviewer(t).Review(t.Context(), "ok-1", time.Time{})
	checkErr(t, err, tokenreview.ErrUnavailable, "tokenreview: API server unavailable: status 307 Temporary Redirect: redirects are not followed")
}

// A server that does not answer: Review gives up at RequestTimeout.
func TestReviewTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("waits RequestTimeout")
	}
	f := newFakeAPI(t)
	release := make(chan struct{})
	defer close(release)
	f.setAnswer(func(w http.ResponseWriter, req *http.Request, _ string) {
		select {
		case <-release:
		case <-req.Context().Done():
		}
	})
	r := f.reviewer(t)
	start := time.Now()
	_, err := r.Review(t.Context(), "ok-1", time.Now().Add(time.Hour))
	took := time.Since(start)
	if !errors.Is(err, tokenreview.ErrUnavailable) || errors.Is(err, tokenreview.ErrRejected) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want ErrUnavailable and context.DeadlineExceeded", err)
	}
	if prefix := `tokenreview: API server unavailable: Post "` + f.srv.URL + `/apis/authentication.k8s.io/v1/tokenreviews": `; !strings.HasPrefix(err.Error(), prefix) {
		t.Errorf("error = %q, want prefix %q", err, prefix)
	}
	if took < tokenreview.RequestTimeout || took > tokenreview.RequestTimeout+time.Second {
		t.Errorf("gave up after %s, want RequestTimeout (%s)", took, tokenreview.RequestTimeout)
	}
	if r.CacheLen() != 0 {
		t.Errorf("an unavailable answer was cached (%d entries)", r.CacheLen())
	}
}

// A caller's deadline ends its Review at once; the request, which no one
// waits for any more, is cancelled (its goroutine ends), not left to
// RequestTimeout.
func TestReviewCallerDeadlineCancelsTheRequest(t *testing.T) {
	f := newFakeAPI(t)
	cancelled := make(chan struct{})
	f.setAnswer(func(w http.ResponseWriter, req *http.Request, _ string) {
		<-req.Context().Done()
		close(cancelled)
	})
	r := f.reviewer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.Review(ctx, "ok-1", time.Now().Add(time.Hour))
	checkErr(t, err, tokenreview.ErrUnavailable, "tokenreview: API server unavailable: context deadline exceeded")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v is not context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("returned after %s, want about 50ms", took)
	}
	select {
	case <-cancelled:
	case <-time.After(tokenreview.RequestTimeout / 2):
		t.Fatal("the request was not cancelled when its only waiter left")
	}
	// An ended ctx sends nothing.
	before := f.requests.Load()
	_, err = r.Review(ctx, "ok-2", time.Now().Add(time.Hour))
	checkErr(t, err, tokenreview.ErrUnavailable, "tokenreview: API server unavailable: context deadline exceeded")
	if f.requests.Load() != before {
		t.Error("a Review with an ended ctx sent a request")
	}
}

// N concurrent Reviews of one token send one request and get one answer;
// one of them leaving early fails no other.
func TestReviewSingleflight(t *testing.T) {
	const n = 32
	f := newFakeAPI(t)
	release := make(chan struct{})
	f.setAnswer(func(w http.ResponseWriter, req *http.Request, tok string) {
		<-release
		writeReview(w, http.StatusCreated, tok, acceptedStatus)
	})
	r := f.reviewer(t)
	const token = "ok-shared"
	notAfter := time.Now().Add(time.Hour)

	// One waiter leaves early; the request goes on for the others.
	early, cancel := context.WithCancel(t.Context())
	earlyErr := make(chan error, 1)
	go func() {
		_, err := r.Review(early, token, notAfter)
		earlyErr <- err
	}()
	waitFor(t, func() bool { return r.Waiters(token) == 1 })

	results := make([]tokenreview.Result, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i], errs[i] = r.Review(t.Context(), token, notAfter) })
	}
	waitFor(t, func() bool { return r.Waiters(token) == n+1 })
	cancel()
	checkErr(t, <-earlyErr, tokenreview.ErrUnavailable, "tokenreview: API server unavailable: context canceled")
	close(release)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || results[i] != (tokenreview.Result{PodName: podName, PodUID: podUID}) {
			t.Fatalf("Review %d = %+v, %v", i, results[i], errs[i])
		}
	}
	if got := f.requests.Load(); got != 1 {
		t.Errorf("%d concurrent Reviews sent %d requests, want 1", n+1, got)
	}
	if _, err := r.Review(t.Context(), token, notAfter); err != nil || f.requests.Load() != 1 {
		t.Errorf("Review after the flight: %v, %d requests; want the cached answer", err, f.requests.Load())
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// How long each answer is used, on an injected clock: an accepted one for
// MaxAcceptedAge or until notAfter, whichever is sooner; a rejected one
// until notAfter; an unavailable one never, nor any when notAfter is past.
func TestReviewCacheLifetimes(t *testing.T) {
	t0 := newClock().Now()
	tests := []struct {
		name      string
		token     string
		notAfter  time.Time
		usedUntil time.Time // the first instant a new request is sent; zero: never cached
		wantIs    error
		wantMsg   string
	}{
		{"accepted: MaxAcceptedAge", "ok-1", t0.Add(time.Hour), t0.Add(tokenreview.MaxAcceptedAge), nil, ""},
		{"accepted: notAfter sooner", "ok-2", t0.Add(3 * time.Second), t0.Add(3 * time.Second), nil, ""},
		{"rejected: until notAfter", "dead-1", t0.Add(time.Hour), t0.Add(time.Hour), tokenreview.ErrRejected,
			`tokenreview: token rejected: not authenticated: "[invalid bearer token, service account token has been invalidated]"`},
		{"unavailable: never", "fail-1", t0.Add(time.Hour), time.Time{}, tokenreview.ErrUnavailable,
			"tokenreview: API server unavailable: status 503 Service Unavailable"},
		{"notAfter already past", "ok-3", t0, time.Time{}, nil, ""},
		{"notAfter zero", "dead-2", time.Time{}, time.Time{}, tokenreview.ErrRejected,
			`tokenreview: token rejected: not authenticated: "[invalid bearer token, service account token has been invalidated]"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			clk := newClock()
			var ev events
			r := f.reviewer(t, tokenreview.WithClock(clk.Now), tokenreview.WithObserver(ev.observe))
			review := func(at time.Time, wantRequests int64, wantCached bool) {
				t.Helper()
				clk.set(at)
				_, err := r.Review(t.Context(), tc.token, tc.notAfter)
				checkErr(t, err, tc.wantIs, tc.wantMsg)
				if got := f.requests.Load(); got != wantRequests {
					t.Errorf("at t0+%s: %d requests, want %d", at.Sub(t0), got, wantRequests)
				}
				if got := ev.last(t).Cached; got != wantCached {
					t.Errorf("at t0+%s: Event.Cached = %v, want %v", at.Sub(t0), got, wantCached)
				}
			}
			review(t0, 1, false)
			if tc.usedUntil.IsZero() {
				review(t0, 2, false)
				return
			}
			review(tc.usedUntil.Add(-time.Nanosecond), 1, true)
			review(tc.usedUntil, 2, false)
		})
	}
}

// The cache never grows past its bound: a full cache of live answers drops
// the one expiring soonest.
func TestReviewCacheBound(t *testing.T) {
	f := newFakeAPI(t)
	clk := newClock()
	t0 := clk.Now()
	r := f.reviewer(t, tokenreview.WithClock(clk.Now))
	r.SetCacheMax(3)
	// Rejected answers until their notAfter: t0+1h, +2h, +3h, +4h.
	for i, tok := range []string{"dead-1", "dead-2", "dead-3", "dead-4"} {
		if _, err := r.Review(t.Context(), tok, t0.Add(time.Duration(i+1)*time.Hour)); !errors.Is(err, tokenreview.ErrRejected) {
			t.Fatal(err)
		}
		if got, want := r.CacheLen(), min(i+1, 3); got != want {
			t.Fatalf("after %d answers the cache holds %d, want %d", i+1, got, want)
		}
	}
	before := f.requests.Load()
	for _, tok := range []string{"dead-2", "dead-3", "dead-4"} {
		_, _ = r.Review(t.Context(), tok, t0.Add(time.Hour))
	}
	if f.requests.Load() != before {
		t.Error("a kept answer was asked again")
	}
	_, _ = r.Review(t.Context(), "dead-1", t0.Add(time.Hour))
	if f.requests.Load() != before+1 {
		t.Error("dead-1, the soonest to expire, was not the one dropped")
	}
}

// The reviewer's token file is read again when it changes, as the kubelet
// rotates a projected token: a new directory behind the ..data link.
func TestReviewReviewerTokenRotates(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	writeVersion := func(v, token string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, v), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, v, "token"), []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(v, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	writeVersion("..2026_07_01_12_00_00.1", "reviewer-token-1")
	if err := os.Symlink(filepath.Join("..data", "token"), filepath.Join(dir, "token")); err != nil {
		t.Fatal(err)
	}
	// The API server accepts only the current reviewer token.
	var current string
	var mu sync.Mutex
	f.setAnswer(func(w http.ResponseWriter, req *http.Request, tok string) {
		mu.Lock()
		ok := req.Header.Get("Authorization") == "Bearer "+current
		mu.Unlock()
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		writeReview(w, http.StatusCreated, tok, acceptedStatus)
	})
	setCurrent := func(s string) { mu.Lock(); current = s; mu.Unlock() }
	cfg := f.config()
	cfg.TokenFile = filepath.Join(dir, "token")
	r, err := tokenreview.New(cfg)
	if err != nil {
		t.Fatal(err)
	}

	setCurrent("reviewer-token-1")
	if _, err := r.Review(t.Context(), "ok-1", time.Time{}); err != nil {
		t.Fatalf("with the first reviewer token: %v", err)
	}
	writeVersion("..2026_07_01_12_48_00.2", "reviewer-token-2")
	setCurrent("reviewer-token-2")
	if _, err := r.Review(t.Context(), "ok-1", time.Time{}); err != nil {
		t.Fatalf("after the rotation: %v (sent %q)", err, f.lastAuth())
	}
	if got := f.lastAuth(); got != "Bearer reviewer-token-2" {
		t.Errorf("after the rotation the reviewer sent %q", got)
	}
	// The old token, now refused: unavailable, not a rejection of the
	// reviewed token.
	setCurrent("reviewer-token-3")
	_, err = r.Review(t.Context(), "ok-1", time.Now().Add(time.Hour))
	checkErr(t, err, tokenreview.ErrUnavailable, "tokenreview: API server unavailable: the API server refused the reviewer's own token (401 Unauthorized)")
	if r.CacheLen() != 0 {
		t.Error("the 401 was cached")
	}
	// The file gone: unavailable, naming the file.
	if err := os.Remove(filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	_, err = r.Review(t.Context(), "ok-1", time.Time{})
	checkErr(t, err, tokenreview.ErrUnavailable, "tokenreview: API server unavailable: the reviewer's token file: stat "+cfg.TokenFile+": no such file or directory")
}

// The observer hears every Review: its outcome, whether the cache answered,
// and how long it took on the Reviewer's clock.
func TestReviewObserver(t *testing.T) {
	f := newFakeAPI(t)
	clk := newClock()
	t0 := clk.Now()
	var ev events
	step := time.Millisecond
	// The clock moves on by step each time it is read while a request is
	// answered, so a request's Event.Duration is not zero.
	f.setAnswer(func(w http.ResponseWriter, req *http.Request, tok string) {
		clk.set(clk.Now().Add(step))
		byToken(w, req, tok)
	})
	r := f.reviewer(t, tokenreview.WithClock(clk.Now), tokenreview.WithObserver(ev.observe))
	notAfter := t0.Add(time.Hour)
	for _, tok := range []string{"ok-1", "ok-1", "dead-1", "dead-1", "fail-1", ""} {
		_, _ = r.Review(t.Context(), tok, notAfter)
	}
	want := []tokenreview.Event{
		{Outcome: tokenreview.OutcomeAccepted, Duration: step},
		{Outcome: tokenreview.OutcomeAccepted, Cached: true},
		{Outcome: tokenreview.OutcomeRejected, Duration: step},
		{Outcome: tokenreview.OutcomeRejected, Cached: true},
		{Outcome: tokenreview.OutcomeUnavailable, Duration: step},
		{Outcome: tokenreview.OutcomeRejected},
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.list) != len(want) {
		t.Fatalf("events = %+v, want %+v", ev.list, want)
	}
	for i := range want {
		if ev.list[i] != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, ev.list[i], want[i])
		}
	}
	if b, _ := json.Marshal(ev.list); strings.Contains(string(b), "ok-1") {
		t.Error("an event holds the token")
	}
}
