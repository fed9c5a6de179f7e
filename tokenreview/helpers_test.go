package tokenreview_test

import (
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/tokenreview"
)

// The names the tests review for, DL-440's.
const (
	audience   = "compass-runner"
	namespace  = "compass-runner"
	sa         = "compass-runner"
	runnerUser = "system:serviceaccount:" + namespace + ":" + sa
	podName    = "compass-runner-x7k2p"
	podUID     = "6c1f5a0e-1f7b-4f0e-9d59-0a4c7a0e2b11"
)

// fakeAPI stands in for an API server's TokenReview endpoint, for what the
// real one cannot be made to do (time out, fail, answer malformed): the live
// tier (test/kube) reviews against a real kube-apiserver.
type fakeAPI struct {
	srv       *httptest.Server
	caFile    string
	tokenFile string

	requests atomic.Int64

	mu       sync.Mutex
	answer   func(w http.ResponseWriter, req *http.Request, token string) // guarded by mu
	auths    []string                                                     // Authorization headers seen
	lastBody []byte                                                       // the last request's body
}

// newFakeAPI starts a fake whose answers depend on the reviewed token (see
// byToken) and writes its CA and a reviewer token file.
func newFakeAPI(t testing.TB) *fakeAPI {
	t.Helper()
	f, err := startFakeAPI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.srv.Close)
	return f
}

// startFakeAPI is newFakeAPI writing its files in dir; the caller closes
// f.srv.
func startFakeAPI(dir string) (*fakeAPI, error) {
	f := &fakeAPI{answer: byToken}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	f.caFile = filepath.Join(dir, "ca.crt")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	f.tokenFile = filepath.Join(dir, "reviewer-token")
	err := errors.Join(os.WriteFile(f.caFile, ca, 0o600), os.WriteFile(f.tokenFile, []byte("reviewer-token-1\n"), 0o600))
	if err != nil {
		f.srv.Close()
		return nil, err
	}
	return f, nil
}

func (f *fakeAPI) serve(w http.ResponseWriter, req *http.Request) {
	f.requests.Add(1)
	raw, _ := io.ReadAll(req.Body)
	var body struct {
		Spec struct {
			Token string `json:"token"`
		} `json:"spec"`
	}
	_ = json.Unmarshal(raw, &body)
	f.mu.Lock()
	answer := f.answer
	f.auths = append(f.auths, req.Header.Get("Authorization"))
	f.lastBody = raw
	f.mu.Unlock()
	answer(w, req, body.Spec.Token)
}

// setAnswer replaces how the fake answers.
func (f *fakeAPI) setAnswer(a func(w http.ResponseWriter, req *http.Request, token string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = a
}

func (f *fakeAPI) lastAuth() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.auths) == 0 {
		return ""
	}
	return f.auths[len(f.auths)-1]
}

func (f *fakeAPI) config() tokenreview.Config {
	return tokenreview.Config{Server: f.srv.URL, TokenFile: f.tokenFile, CAFile: f.caFile,
		Audience: audience, Namespace: namespace, ServiceAccount: sa}
}

// reviewer is a Reviewer of the fake, with opts.
func (f *fakeAPI) reviewer(t testing.TB, opts ...tokenreview.Option) *tokenreview.Reviewer {
	t.Helper()
	r, err := tokenreview.New(f.config(), opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

// byToken answers as kube-apiserver would for tokens named for the answer
// they get: "ok-..." is a Runner pod's live token, "dead-..." one whose pod
// is deleted, "fail-..." meets a 503.
func byToken(w http.ResponseWriter, _ *http.Request, token string) {
	switch {
	case strings.HasPrefix(token, "ok-"):
		writeReview(w, http.StatusCreated, token, acceptedStatus)
	case strings.HasPrefix(token, "dead-"):
		writeReview(w, http.StatusCreated, token, deletedPodStatus)
	default:
		http.Error(w, "etcdserver: request timed out", http.StatusServiceUnavailable)
	}
}

// acceptedStatus is kube-apiserver v1.37's status for a pod-bound token of
// the Runner ServiceAccount reviewed for audience compass-runner.
const acceptedStatus = `{"authenticated":true,"user":{"username":"` + runnerUser + `",
"uid":"3f0b6e0e-8c1a-4f57-9d1b-6a3e2b0c9d10","groups":["system:serviceaccounts","system:serviceaccounts:compass-runner","system:authenticated"],
"extra":{"authentication.kubernetes.io/credential-id":["JTI=0b7e4c1a-2f3d-4e5f-8a9b-1c2d3e4f5a6b"],
"authentication.kubernetes.io/node-name":["ip-10-0-1-5.ec2.internal"],"authentication.kubernetes.io/node-uid":["9a8b7c6d-5e4f-4a3b-2c1d-0e9f8a7b6c5d"],
"authentication.kubernetes.io/pod-name":["` + podName + `"],"authentication.kubernetes.io/pod-uid":["` + podUID + `"]}},"audiences":["compass-runner"]}`

// deletedPodStatus is its status once the pod is deleted.
const deletedPodStatus = `{"user":{},"error":"[invalid bearer token, service account token has been invalidated]"}`

// writeReview answers a TokenReview as kube-apiserver does: the request
// echoed (the token in spec.token) with status.
func writeReview(w http.ResponseWriter, code int, token, status string) {
	tok, _ := json.Marshal(token)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, `{"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","metadata":{},"spec":{"token":`+
		string(tok)+`,"audiences":["compass-runner"]},"status":`+status+"}\n")
}

// clock is a settable clock for WithClock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// events records what WithObserver reports.
type events struct {
	mu   sync.Mutex
	list []tokenreview.Event
}

func (e *events) observe(ev tokenreview.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, ev)
}

func (e *events) last(t *testing.T) tokenreview.Event {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.list) == 0 {
		t.Fatal("no event")
	}
	return e.list[len(e.list)-1]
}
