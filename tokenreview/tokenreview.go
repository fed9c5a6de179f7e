package tokenreview

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/compass-runner/identity/internal/lib/bearerfile"
)

// The limits, each with its reason.
const (
	// RequestTimeout bounds one TokenReview, from the connection to the last
	// byte of the answer. A healthy API server answers in milliseconds (a
	// ServiceAccount token is checked against its informers' caches); the
	// callout has DefaultAnswerHorizon, 1.8 s, for the whole answer to NATS
	// and already gives its resolver a deadline inside that, so this bound
	// is for callers without one (the gRPC door): 1.5 s leaves such a caller
	// time to answer Unavailable before a NATS client's first PING (2 s)
	// would have given up on the same API server. A caller's ctx deadline
	// applies too, whichever comes first.
	RequestTimeout = 1500 * time.Millisecond

	// MaxTokenBytes caps a reviewed token before anything else: the
	// verifier's own cap (verifier.MaxTokenBytes), so a token this package
	// refuses for its length was never verified either. A projected token is
	// 1-2 KiB.
	MaxTokenBytes = 16 << 10

	// MaxResponseBytes caps the API server's answer read into memory. The
	// answer echoes the request (the token, at most MaxTokenBytes) and adds
	// a ServiceAccount's user info, well under 2 KiB; anything larger is not
	// a TokenReview of such a token and is refused as unavailable.
	MaxResponseBytes = 64 << 10

	// MaxCacheEntries bounds the answers remembered: an entry is a SHA-256
	// and a pod's name and UID, about 250 bytes, so at most about 4 MiB. A
	// Runner presents one token at a time (two for a moment when the kubelet
	// rotates it), and Kubernetes supports 5,000 nodes per cluster, so a
	// cluster's live tokens fit with room. A full cache drops its expired
	// entries first and then the one expiring soonest: it never grows.
	MaxCacheEntries = 16384

	// MaxAcceptedAge bounds how long an accepted answer is reused. A
	// rejected one is reused until the caller's notAfter, since a refused
	// token is not accepted again; an accepted one is exactly what the
	// review exists to revisit, since the pod may be deleted the next
	// moment. Reusing it until notAfter (the token's exp plus leeway: 10 min
	// to 1 h for a projected token) would bring back the gap the review
	// closes. 10 s is kube-apiserver's own reuse of a successful token
	// authentication (TokenSuccessCacheTTL), so a deleted pod's token is
	// refused within about 20 s of the deletion (this bound, the API
	// server's, and its informers' lag of milliseconds); and one Runner
	// reconnecting in a storm, or calling a door repeatedly, costs one
	// review per 10 s per process.
	MaxAcceptedAge = 10 * time.Second

	// maxErrorText caps the API server's status.error quoted in a
	// rejection's message: enough for kube-apiserver's messages ("[invalid
	// bearer token, service account token has been invalidated]"), not
	// enough for a log line to be flooded.
	maxErrorText = 256
)

// The failure shape. Every error Review returns satisfies exactly one of
// these with errors.Is; its message says why, and never quotes the token.
var (
	// ErrRejected means the API server answered and the token is not
	// accepted: not authenticated (its pod or ServiceAccount deleted, its
	// signing key gone, expired), authenticated for another audience, as
	// another user than the configured ServiceAccount, or bound to no pod.
	// A token longer than MaxTokenBytes, or empty, is rejected without a
	// request.
	ErrRejected = errors.New("tokenreview: token rejected")

	// ErrUnavailable means there is no answer about the token: the network,
	// a timeout or the caller's ctx, a 5xx or another unexpected status, a
	// redirect, the API server refusing the reviewer's own credentials (401,
	// 403), an unreadable reviewer token file, or an answer that is not a
	// TokenReview. It says nothing about the token.
	ErrUnavailable = errors.New("tokenreview: API server unavailable")
)

// Outcomes, as Event.Outcome reports them.
const (
	OutcomeAccepted    = "accepted"
	OutcomeRejected    = "rejected"
	OutcomeUnavailable = "unavailable"
)

// Event is one Review's outcome, for the caller's metrics.
type Event struct {
	Outcome  string        // OutcomeAccepted, OutcomeRejected or OutcomeUnavailable
	Cached   bool          // answered from the cache, without waiting for a request
	Duration time.Duration // from the call to the answer, on the Reviewer's clock
}

// Config is one cluster's API server and what its tokens must be bound to.
type Config struct {
	Server         string // https://host[:port]; required, https only
	TokenFile      string // the reviewer's own bearer token, re-read when the file changes (a projected token rotates); required
	CAFile         string // PEM CA of the API server; "" = system roots
	Audience       string // the audience the reviewed token must carry (spec.audiences); required
	Namespace      string // the ServiceAccount the token must belong to:
	ServiceAccount string //   username system:serviceaccount:<Namespace>:<ServiceAccount>
}

// Result is what the API server says about an accepted token: the pod it is
// bound to. The caller compares it with the pod the offline-verified claims
// name.
type Result struct {
	PodName string
	PodUID  string
}

// Reviewer sends TokenReviews to one cluster's API server and remembers the
// answers. It is safe for concurrent use. It starts no goroutine of its own:
// each request runs on one that ends with the request, when the last Review
// waiting for it returns, or at RequestTimeout.
type Reviewer struct {
	endpoint string // Server + tokenReviewPath
	audience string
	username string // system:serviceaccount:<ns>:<sa>
	base     *http.Client
	client   *http.Client
	now      func() time.Time
	observe  func(Event)
	cred     *bearerfile.File

	mu      sync.Mutex
	cache   *cache                        // guarded by mu
	flights map[[sha256.Size]byte]*flight // guarded by mu
}

// Option configures a Reviewer; New takes any number of them, applied in
// order. Each has a default.
type Option func(*Reviewer)

// WithHTTPClient sets the client whose Transport sends the reviews. The
// default, and what nil leaves in place, is http.DefaultTransport. Only the
// Transport is used: the package sets its own timeout (RequestTimeout) and
// refuses redirects, and with a CAFile it uses a clone of the Transport that
// trusts that CA alone, which New refuses when the Transport is not an
// *http.Transport.
func WithHTTPClient(c *http.Client) Option {
	return func(r *Reviewer) {
		if c != nil {
			r.base = c
		}
	}
}

// WithClock sets the clock by which cached answers expire and Event.Duration
// is measured. The default, and what nil leaves in place, is time.Now.
func WithClock(now func() time.Time) Option {
	return func(r *Reviewer) {
		if now != nil {
			r.now = now
		}
	}
}

// WithObserver calls f after every Review with its outcome, on the Review's
// goroutine: f must not block. The default, and what nil leaves in place,
// observes nothing.
func WithObserver(f func(Event)) Option {
	return func(r *Reviewer) {
		if f != nil {
			r.observe = f
		}
	}
}

// tokenReviewPath is where TokenReviews are created, below Config.Server.
const tokenReviewPath = "/apis/authentication.k8s.io/v1/tokenreviews"

// dnsLabel is an RFC 1123 label, a namespace's name; dnsSubdomain is an RFC
// 1123 subdomain, a ServiceAccount's.
var (
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// New checks cfg, reads the CA file and the reviewer's token file, and
// returns a Reviewer configured by opts (WithHTTPClient, WithClock,
// WithObserver). It sends nothing. Every problem with cfg is reported, each
// naming its field.
func New(cfg Config, opts ...Option) (*Reviewer, error) {
	r := &Reviewer{
		audience: cfg.Audience,
		username: "system:serviceaccount:" + cfg.Namespace + ":" + cfg.ServiceAccount,
		now:      time.Now,
		observe:  func(Event) {},
		cache:    newCache(MaxCacheEntries),
		flights:  map[[sha256.Size]byte]*flight{},
	}
	for _, o := range opts {
		o(r)
	}
	var errs []error
	endpoint, err := checkServer(cfg.Server)
	if err != nil {
		errs = append(errs, fmt.Errorf("tokenreview: Config.Server: %w", err))
	}
	r.endpoint = endpoint
	if cfg.TokenFile == "" {
		errs = append(errs, errors.New("tokenreview: Config.TokenFile: required"))
	} else {
		r.cred = &bearerfile.File{Path: cfg.TokenFile, Max: MaxTokenBytes}
		if _, err := r.cred.Token(); err != nil {
			errs = append(errs, fmt.Errorf("tokenreview: Config.TokenFile: %w", err))
		}
	}
	if cfg.Audience == "" {
		errs = append(errs, errors.New("tokenreview: Config.Audience: required"))
	} else if strings.ContainsFunc(cfg.Audience, isControl) {
		errs = append(errs, errors.New("tokenreview: Config.Audience: contains a control character"))
	}
	switch {
	case cfg.Namespace == "":
		errs = append(errs, errors.New("tokenreview: Config.Namespace: required"))
	case len(cfg.Namespace) > 63 || !dnsLabel.MatchString(cfg.Namespace):
		errs = append(errs, fmt.Errorf("tokenreview: Config.Namespace: %q is not a namespace name (an RFC 1123 label)", cfg.Namespace))
	}
	switch {
	case cfg.ServiceAccount == "":
		errs = append(errs, errors.New("tokenreview: Config.ServiceAccount: required"))
	case len(cfg.ServiceAccount) > 253 || !dnsSubdomain.MatchString(cfg.ServiceAccount):
		errs = append(errs, fmt.Errorf("tokenreview: Config.ServiceAccount: %q is not a ServiceAccount name (an RFC 1123 subdomain)", cfg.ServiceAccount))
	}
	if r.client, err = newClient(r.base, cfg.CAFile); err != nil {
		errs = append(errs, fmt.Errorf("tokenreview: Config.CAFile: %w", err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return r, nil
}

// checkServer returns the TokenReview endpoint below server, an https URL
// with a host (a path is kept: an API server behind a proxy's prefix).
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
		return "", errors.New("holds credentials: the reviewer's credential is Config.TokenFile")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", fmt.Errorf("%s has a query or a fragment", u.Redacted())
	}
	return strings.TrimSuffix(u.String(), "/") + tokenReviewPath, nil
}

// newClient is the HTTP client of the reviews: base's Transport (trusting
// caFile alone when set), RequestTimeout, and no redirects.
func newClient(base *http.Client, caFile string) (*http.Client, error) {
	var rt http.RoundTripper = http.DefaultTransport
	if base != nil && base.Transport != nil {
		rt = base.Transport
	}
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
		t, ok := rt.(*http.Transport)
		if !ok {
			return nil, errors.New("the HTTP client's transport is not an *http.Transport")
		}
		t = t.Clone()
		if t.TLSClientConfig == nil {
			t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		t.TLSClientConfig.RootCAs = pool
		// As the verifier's key fetch: a clone offers h2 in its ALPN list
		// without always being set up for it; let it offer what it is set
		// up for.
		t.TLSClientConfig.NextProtos = nil
		rt = t
	}
	return &http.Client{
		Transport: rt,
		Timeout:   RequestTimeout,
		// Not followed: a redirect would send the reviewed token, which is
		// in the body, to wherever it points (307 and 308 resend it).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }
