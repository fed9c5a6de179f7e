package podwatch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compass-runner/identity/internal/lib/bearerfile"
)

// The limits, each with its reason.
const (
	// ListPageSize is the pods one list request asks for (limit=), the rest
	// following by continue tokens: the API server builds each page in its
	// memory, and this package decodes a page's pods one at a time, so a
	// page bounds both. 500 is what client-go's informers ask for.
	ListPageSize = 500

	// MaxEventBytes caps one watch event, and one pod of a list page, as
	// JSON; a larger one is refused as malformed. It is not smaller than the
	// largest Pod the API server can hold: etcd refuses a value over 1.5 MiB
	// (--max-request-bytes) of protobuf, and the same pod as JSON is larger
	// (field names, quoting). A cap below that would refuse a real pod, and
	// the watch, re-watched from the same resourceVersion, would meet it
	// again for ever. A Runner pod is about 5 KiB. The decoder holds at most
	// about twice this per stream.
	MaxEventBytes = 4 << 20

	// MaxTrackedPods bounds the pods remembered (UID, name, node, whether
	// reported: at most about 700 bytes each, names at their longest, so
	// at most about 14 MiB; about 3 MiB for typical names). They are what
	// makes a report once per UID and what a relist compares with, to report
	// the pods deleted while the watch was down. Kubernetes supports 5,000
	// nodes, a Runner pod per node, two for a moment while the DaemonSet
	// rolls: 20,000 leaves room for other pods of the namespace. Past it, a
	// new pod is not remembered (an ERROR says so once): it is still
	// reported when it is deleted or marked for deletion, possibly more than
	// once, but not when it is deleted while the watch is down.
	MaxTrackedPods = 20000

	// RequestTimeout bounds one list request, from the connection to the
	// last byte of the page, and a watch request until its response
	// headers. kube-apiserver's own limit for a non-long-running request is
	// 60 s (--request-timeout); a page of 500 pods takes it milliseconds to
	// a second.
	RequestTimeout = 30 * time.Second

	// WatchTimeout is the watch's timeoutSeconds: the API server ends the
	// stream after it, and the watch is opened again from the last
	// resourceVersion seen, so no request (nor the credential it was
	// authenticated with: a projected token lives 10 min at least) lives
	// longer. client-go's reflectors use 5 to 10 min.
	WatchTimeout = 5 * time.Minute

	// BookmarkInterval is how often kube-apiserver sends a watch that
	// allows bookmarks a BOOKMARK event when nothing else happened (its
	// watch cache's bookmark frequency, one minute), and once more 2 s
	// before timeoutSeconds.
	BookmarkInterval = time.Minute

	// WatchIdleTimeout is how long a watch stream may be silent, not even a
	// bookmark arriving, before it is taken for dead: closed, logged at
	// ERROR and opened again. Two bookmark intervals and a slack for a busy
	// API server. A dead TCP connection is found sooner over HTTP/2, whose
	// pings (h2PingAfter, h2PingTimeout) close it for every stream on it.
	WatchIdleTimeout = 2*BookmarkInterval + 10*time.Second

	// h2PingAfter and h2PingTimeout: over HTTP/2 (which kube-apiserver
	// speaks) the list and the watch share one connection, and a request
	// cancelled on a dead connection leaves the connection in the pool for
	// the next request to hang on. A ping after 30 s of silence, answered
	// within 15 s or the connection closed, ends that (client-go sets the
	// same, kubernetes#87615).
	h2PingAfter   = 30 * time.Second
	h2PingTimeout = 15 * time.Second

	// maxErrorBody caps an error answer read for its Status message.
	maxErrorBody = 64 << 10

	// maxQuoted caps text from the API server quoted in a log line or an
	// error: enough for kube-apiserver's messages, not enough to flood.
	maxQuoted = 256

	// maxTokenBytes caps the watcher's token file: a projected token is 1-2
	// KiB, a legacy Secret's about 1 KiB.
	maxTokenBytes = 16 << 10

	// maxLabelSelector caps Config.LabelSelector: a few label requirements.
	maxLabelSelector = 1024
)

// The default reconnect backoff: from defaultBackoffMin, doubling on each
// failure in a row, to defaultBackoffMax, each wait jittered.
const (
	defaultBackoffMin = 100 * time.Millisecond
	defaultBackoffMax = 10 * time.Second
)

// Config is one cluster's API server and the pods to watch there.
type Config struct {
	Server        string // https://host[:port]; required, https only
	TokenFile     string // the watcher's own bearer token, re-read when the file changes; required
	CAFile        string // PEM CA of the API server; "" = system roots
	Namespace     string // required: the Runner's namespace
	LabelSelector string // optional, e.g. app.kubernetes.io/name=compass-runner
}

// Gone is one pod going away: deleted, or marked for deletion
// (deletionTimestamp set: the kubelet is stopping it; a Runner in it is
// shutting down, and its token must not outlive it).
type Gone struct {
	UID  string
	Name string
	Node string    // spec.nodeName; "" for a pod never scheduled
	At   time.Time // when the watch saw it, on the Watcher's clock
}

// Watcher watches the pods of one namespace of one API server and reports
// those going away. Run does the watching; Healthy may be called from any
// goroutine.
type Watcher struct {
	podsURL    string // Server + /api/v1/namespaces/<ns>/pods
	server     string // for log lines
	namespace  string
	selector   string
	cred       *bearerfile.File
	listClient *http.Client // RequestTimeout, no redirects
	watchCl    *http.Client // no timeout (the stream's own bounds), no redirects
	onGone     func(Gone)
	now        func() time.Time
	log        *slog.Logger
	base       *http.Client
	backoffMin time.Duration
	backoffMax time.Duration

	// Tests shorten these (export_test.go).
	requestTimeout time.Duration
	idleTimeout    time.Duration
	watchTimeout   time.Duration
	maxTracked     int
	sleep          func(ctx context.Context, d time.Duration) error

	running atomic.Bool

	// Run's own state, touched only by the goroutine running it.
	pods     map[string]*podState // by UID, at most maxTracked
	gen      uint64               // the current list's mark (podState.seen)
	overflow bool                 // the ERROR for a full pods map was logged

	mu      sync.Mutex
	healthy bool      // guarded by mu
	since   time.Time // guarded by mu
}

// Option configures a Watcher; New takes any number of them, applied in
// order. Each has a default.
type Option func(*Watcher)

// WithHTTPClient sets the client whose Transport sends the requests. The
// default, and what nil leaves in place, is http.DefaultTransport. Only the
// Transport is used: an *http.Transport is cloned (trusting CAFile alone
// when set, and with HTTP/2 pings); the package sets its own timeouts and
// refuses redirects. With a CAFile, New refuses a Transport that is not an
// *http.Transport.
func WithHTTPClient(c *http.Client) Option {
	return func(w *Watcher) {
		if c != nil {
			w.base = c
		}
	}
}

// WithClock sets the clock of Gone.At and of Healthy's since. The default,
// and what nil leaves in place, is time.Now. Waits (backoff, timeouts) are
// real time whatever the clock.
func WithClock(now func() time.Time) Option {
	return func(w *Watcher) {
		if now != nil {
			w.now = now
		}
	}
}

// WithLogger sets where the watch's failures (ERROR) and recoveries (INFO)
// are logged. The default discards them.
func WithLogger(l *slog.Logger) Option {
	return func(w *Watcher) {
		if l != nil {
			w.log = l
		}
	}
}

// WithBackoff sets the wait before a failed list or watch is tried again:
// min after the first failure, doubling on each failure in a row up to max,
// each wait drawn at random from its upper half. The defaults are 100 ms and
// 10 s; a value that is not positive, or a max below min, leaves the
// defaults in place.
func WithBackoff(min, max time.Duration) Option {
	return func(w *Watcher) {
		if min > 0 && max >= min {
			w.backoffMin, w.backoffMax = min, max
		}
	}
}

// dnsLabel is an RFC 1123 label, a namespace's name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// selectorChars are the characters of a label selector: label keys and
// values (alphanumerics, '-', '_', '.', '/'), the operators (=, ==, !=, !,
// in, notin, <, >), parentheses, commas and spaces. The API server checks
// the rest (a 400, logged and retried like any failure).
var selectorChars = regexp.MustCompile(`^[A-Za-z0-9_./=!(),<> -]*$`)

// New checks cfg, reads the CA file and the watcher's token file, and
// returns a Watcher that calls onGone for each pod going away, configured by
// opts (WithHTTPClient, WithClock, WithLogger, WithBackoff). It sends
// nothing. Every problem with cfg is reported, each naming its field.
func New(cfg Config, onGone func(Gone), opts ...Option) (*Watcher, error) {
	w := &Watcher{
		namespace:      cfg.Namespace,
		selector:       cfg.LabelSelector,
		onGone:         onGone,
		now:            time.Now,
		log:            slog.New(slog.DiscardHandler),
		backoffMin:     defaultBackoffMin,
		backoffMax:     defaultBackoffMax,
		requestTimeout: RequestTimeout,
		idleTimeout:    WatchIdleTimeout,
		watchTimeout:   WatchTimeout,
		maxTracked:     MaxTrackedPods,
		sleep:          sleepCtx,
		pods:           map[string]*podState{},
	}
	for _, o := range opts {
		o(w)
	}
	w.since = w.now()
	var errs []error
	if onGone == nil {
		errs = append(errs, errors.New("podwatch: onGone: required"))
	}
	server, err := checkServer(cfg.Server)
	if err != nil {
		errs = append(errs, fmt.Errorf("podwatch: Config.Server: %w", err))
	}
	w.server = server
	if cfg.TokenFile == "" {
		errs = append(errs, errors.New("podwatch: Config.TokenFile: required"))
	} else {
		w.cred = &bearerfile.File{Path: cfg.TokenFile, Max: maxTokenBytes}
		if _, err := w.cred.Token(); err != nil {
			errs = append(errs, fmt.Errorf("podwatch: Config.TokenFile: %w", err))
		}
	}
	switch {
	case cfg.Namespace == "":
		errs = append(errs, errors.New("podwatch: Config.Namespace: required"))
	case len(cfg.Namespace) > 63 || !dnsLabel.MatchString(cfg.Namespace):
		errs = append(errs, fmt.Errorf("podwatch: Config.Namespace: %q is not a namespace name (an RFC 1123 label)", cfg.Namespace))
	}
	switch {
	case len(cfg.LabelSelector) > maxLabelSelector:
		errs = append(errs, fmt.Errorf("podwatch: Config.LabelSelector: longer than %d bytes", maxLabelSelector))
	case !selectorChars.MatchString(cfg.LabelSelector):
		errs = append(errs, fmt.Errorf("podwatch: Config.LabelSelector: %q holds a character no label selector has", cfg.LabelSelector))
	}
	rt, err := newTransport(w.base, cfg.CAFile)
	if err != nil {
		errs = append(errs, fmt.Errorf("podwatch: Config.CAFile: %w", err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	w.podsURL = server + "/api/v1/namespaces/" + cfg.Namespace + "/pods"
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	w.listClient = &http.Client{Transport: rt, Timeout: w.requestTimeout, CheckRedirect: noRedirect}
	// No Timeout: it would end the stream. The watch bounds itself
	// (requestTimeout until the headers, idleTimeout between events, and
	// the server's timeoutSeconds).
	w.watchCl = &http.Client{Transport: rt, CheckRedirect: noRedirect}
	return w, nil
}

// checkServer returns server without a trailing slash: an https URL with a
// host (a path is kept: an API server behind a proxy's prefix).
func checkServer(server string) (string, error) {
	if server == "" {
		return "", errors.New("required")
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", errors.New("not a URL") // url's error quotes the input, which may hold credentials
	}
	switch {
	case u.Scheme != "https":
		return "", fmt.Errorf("scheme %q, want https", u.Scheme)
	case u.Host == "":
		return "", errors.New("no host")
	case u.User != nil:
		return "", errors.New("holds credentials: the watcher's credential is Config.TokenFile")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", fmt.Errorf("%s has a query or a fragment", u.Redacted())
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// newTransport is the Transport of the requests: a clone of base's (or of
// http.DefaultTransport), trusting caFile alone when set, pinging an HTTP/2
// connection that falls silent. A Transport that is not an *http.Transport
// is used as it is, and refused with a caFile.
func newTransport(base *http.Client, caFile string) (http.RoundTripper, error) {
	var rt http.RoundTripper = http.DefaultTransport
	if base != nil && base.Transport != nil {
		rt = base.Transport
	}
	t, ok := rt.(*http.Transport)
	if !ok {
		if caFile != "" {
			return nil, errors.New("the HTTP client's transport is not an *http.Transport")
		}
		return rt, nil
	}
	t = t.Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		// The CA file is the API server's whole trust: not added to the
		// system roots, so no public CA can vouch for a private API server.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
		}
		if t.TLSClientConfig == nil {
			t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		t.TLSClientConfig.RootCAs = pool
		// As the verifier's key fetch: a clone offers h2 in its ALPN list
		// without always being set up for it; let it offer what it is set
		// up for.
		t.TLSClientConfig.NextProtos = nil
	}
	if t.HTTP2 == nil {
		t.HTTP2 = &http.HTTP2Config{}
	} else {
		c := *t.HTTP2
		t.HTTP2 = &c
	}
	if t.HTTP2.SendPingTimeout == 0 {
		t.HTTP2.SendPingTimeout = h2PingAfter
	}
	if t.HTTP2.PingTimeout == 0 {
		t.HTTP2.PingTimeout = h2PingTimeout
	}
	return t, nil
}

// Healthy reports whether the watch is established now: the list succeeded
// and a watch stream is open. since is when that last changed (before the
// first watch: when the Watcher was made), on the Watcher's clock. The
// stream the API server ends at timeoutSeconds, and a relist it asks for
// (410), are not failures: Healthy stays true while they are redone, unless
// they fail.
func (w *Watcher) Healthy() (ok bool, since time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.healthy, w.since
}

// setHealthy records ok, and when it changed; it returns whether it did.
func (w *Watcher) setHealthy(ok bool) (changed bool, was time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	was = w.since
	if w.healthy == ok {
		return false, was
	}
	w.healthy, w.since = ok, w.now()
	return true, was
}
