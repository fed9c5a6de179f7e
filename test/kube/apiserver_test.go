package kube

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Names from DL-440.
const (
	runnerNS       = "compass-runner"
	runnerSA       = "compass-runner"
	runnerDS       = "compass-runner"
	runnerAudience = "compass-runner"
	runnerNode     = "ip-10-0-1-5.ec2.internal"
	otherNode      = "ip-10-0-1-6.ec2.internal"
	runnerID       = "live/ip-10-0-1-5_ec2_internal"
	tokenSeconds   = 600 // the projected volume's expirationSeconds, the TokenRequest minimum

	// The policy's default controllers and deployers render parameters.
	dsControllerUser = "system:serviceaccount:kube-system:daemon-set-controller"
	sharedCMUser     = "system:kube-controller-manager"
	deployerUser     = "system:serviceaccount:flux-system:kustomize-controller"
)

// Waits on the API server, an external process; each is a deadline, not a sleep.
const (
	// startTimeout bounds one etcd + kube-apiserver start. A warm start takes a
	// few seconds; the two cores are shared with other test binaries in CI.
	startTimeout = 120 * time.Second
	// stopTimeout bounds a graceful stop before the process is killed.
	stopTimeout = 30 * time.Second
	// settleTimeout bounds informer-driven changes: an RBAC binding, the Node
	// authorizer's graph, an admission policy becoming active. Usually < 2 s.
	settleTimeout = 30 * time.Second
	// pollInterval is how often such a change is re-checked.
	pollInterval = 100 * time.Millisecond
)

// assetsDir is where kube-apiserver and etcd are: $KUBEBUILDER_ASSETS, or the
// repository's .bin (where .ci/kube.sh puts them).
func assetsDir() (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return filepath.Abs(d)
	}
	return filepath.Abs(filepath.Join("..", "..", ".bin"))
}

// requireBinaries returns the assets directory, or ends the test: it fails
// under CI (the tier must run there) and skips otherwise.
func requireBinaries(t testing.TB) string {
	t.Helper()
	dir, err := assetsDir()
	if err != nil {
		t.Fatalf("test/kube: assets directory: %v", err)
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			msg := fmt.Sprintf("test/kube: %s not found in %s; build the control plane with .ci/kube.sh (or set KUBEBUILDER_ASSETS)", name, dir)
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg + "; skipped because CI is unset")
		}
	}
	return dir
}

// saKey is a ServiceAccount signing key written where kube-apiserver reads it.
type saKey struct {
	signer  crypto.Signer
	keyPath string // PKCS #8 private key
	pubPath string // PKIX public key
}

// kid is the key ID Kubernetes gives the key: base64url(SHA-256(PKIX DER)).
func (k *saKey) kid() string {
	der, err := x509.MarshalPKIXPublicKey(k.signer.Public())
	if err != nil {
		panic(fmt.Sprintf("test/kube: marshal public key: %v", err))
	}
	sum := sha256.Sum256(der)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

func newRSAKey(dir, name string) (*saKey, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("test/kube: rsa key: %w", err)
	}
	return writeKey(dir, name, k)
}

func newECKey(dir, name string) (*saKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("test/kube: ec key: %w", err)
	}
	return writeKey(dir, name, k)
}

func writeKey(dir, name string, k crypto.Signer) (*saKey, error) {
	priv, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("test/kube: marshal key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return nil, fmt.Errorf("test/kube: marshal public key: %w", err)
	}
	out := &saKey{signer: k, keyPath: filepath.Join(dir, name+".key"), pubPath: filepath.Join(dir, name+".pub")}
	if err := os.WriteFile(out.keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}), 0o600); err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	if err := os.WriteFile(out.pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	return out, nil
}

// serverSpec is how one kube-apiserver is configured.
type serverSpec struct {
	name    string   // for errors and the log file name
	issuer  string   // --service-account-issuer; "" means the server's own https URL
	signing *saKey   // --service-account-signing-key-file
	extra   []*saKey // published beside the signing key (--service-account-key-file)
	// issuerAudienceOnly sets --api-audiences to the issuer alone (what
	// kube-apiserver defaults to) instead of compass-runner and the issuer.
	issuerAudienceOnly bool
}

// apiServer is one control plane (etcd + kube-apiserver) under envtest.
type apiServer struct {
	name   string
	dir    string
	env    *envtest.Environment
	url    string // https://127.0.0.1:<port>
	issuer string
	caFile string // the serving CA, PEM
	logf   *os.File
	admin  *rest.Config // system:masters
	cs     kubernetes.Interface
}

// startAPIServer starts etcd and kube-apiserver configured as a cluster for
// this project: an https issuer reachable on loopback (--advertise-address
// 127.0.0.1, which needs --endpoint-reconciler-type=none), --api-audiences with
// compass-runner, Node and RBAC authorization, NodeRestriction and the
// ServiceAccount admission plugin (which envtest disables by default), and
// OIDC discovery readable anonymously as DL-440's self-host guide's first
// option describes.
func startAPIServer(ctx context.Context, assets string, spec serverSpec, dir string) (_ *apiServer, err error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &apiServer{name: spec.name, dir: dir, url: "https://127.0.0.1:" + strconv.Itoa(port)}
	s.issuer = spec.issuer
	if s.issuer == "" {
		s.issuer = s.url
	}
	s.logf, err = os.Create(filepath.Join(dir, spec.name+"-apiserver.log"))
	if err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	certDir := filepath.Join(dir, spec.name+"-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	s.env = &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: startTimeout,
		ControlPlaneStopTimeout:  stopTimeout,
	}
	api := s.env.ControlPlane.GetAPIServer()
	api.CertDir = certDir // kept across restarts, so the serving CA stays the same
	api.SecureServing.ListenAddr = envtest.ListenAddr{Address: "127.0.0.1", Port: strconv.Itoa(port)}
	api.Out, api.Err = s.logf, s.logf
	s.configure(spec)

	s.admin, err = s.env.Start()
	if err != nil {
		return nil, fmt.Errorf("test/kube: start %s: %w%s", spec.name, err, s.logTail())
	}
	defer func() {
		if err != nil {
			_ = s.stop()
		}
	}()
	s.caFile = filepath.Join(dir, spec.name+"-ca.crt")
	if err := os.WriteFile(s.caFile, api.SecureServing.CA, 0o600); err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	if s.cs, err = kubernetes.NewForConfig(s.admin); err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	if err := s.allowAnonymousDiscovery(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// configure sets the flags that make the server look like a real cluster.
func (s *apiServer) configure(spec serverSpec) {
	args := s.env.ControlPlane.GetAPIServer().Configure()
	args.Set("service-account-issuer", s.issuer)
	args.Set("service-account-signing-key-file", spec.signing.keyPath)
	pubs := []string{spec.signing.pubPath}
	for _, k := range spec.extra {
		pubs = append(pubs, k.pubPath)
	}
	args.Set("service-account-key-file", pubs...)
	// compass-runner, as the live tier was specified (see docs/kube-tier.md); the issuer keeps ordinary
	// ServiceAccount tokens (whose default audience it is) working.
	if spec.issuerAudienceOnly {
		args.Set("api-audiences", s.issuer)
	} else {
		args.Set("api-audiences", runnerAudience+","+s.issuer)
	}
	args.Set("advertise-address", "127.0.0.1")
	args.Set("endpoint-reconciler-type", "none")
	args.Set("anonymous-auth", "true")
	args.Set("authorization-mode", "Node,RBAC")
	args.Set("enable-admission-plugins", "NodeRestriction")
	args.Disable("disable-admission-plugins") // envtest turns ServiceAccount off; a real cluster has it
	// A stop ends the open watches (podwatch's) within 2 s: by default
	// kube-apiserver leaves them open until its 60 s shutdown timeout,
	// longer than stopTimeout, and restart would fail on the kill.
	args.Set("shutdown-watch-termination-grace-period", "2s")
}

// restart stops kube-apiserver (etcd keeps running, so every object stays) and
// starts it again with spec's keys.
func (s *apiServer) restart(ctx context.Context, spec serverSpec) error {
	api := s.env.ControlPlane.GetAPIServer()
	if err := api.Stop(); err != nil {
		return fmt.Errorf("test/kube: stop %s: %w", s.name, err)
	}
	s.configure(spec)
	if err := api.Start(); err != nil {
		return fmt.Errorf("test/kube: restart %s: %w%s", s.name, err, s.logTail())
	}
	// Ready means RBAC answers for the anonymous discovery binding again.
	return s.waitAnonymousDiscovery(ctx)
}

func (s *apiServer) stop() error {
	err := s.env.Stop()
	if s.logf != nil {
		_ = s.logf.Close()
	}
	if err != nil {
		return fmt.Errorf("test/kube: stop %s: %w", s.name, err)
	}
	return nil
}

// logTail is the end of the server's log, for start failures.
func (s *apiServer) logTail() string {
	data, err := os.ReadFile(s.logf.Name())
	if err != nil || len(data) == 0 {
		return ""
	}
	const tail = 4 << 10 // enough for the fatal flag or bind error
	if len(data) > tail {
		data = data[len(data)-tail:]
	}
	return "\n--- " + s.name + " kube-apiserver log tail ---\n" + string(data)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("test/kube: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// as returns a client impersonating user with groups (the admin may
// impersonate anyone; authorization then runs as that user).
func (s *apiServer) as(user string, groups ...string) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(s.asConfig(user, groups...))
}

func (s *apiServer) asConfig(user string, groups ...string) *rest.Config {
	cfg := rest.CopyConfig(s.admin)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// asServiceAccount impersonates a ServiceAccount with the groups the API
// server gives it.
func (s *apiServer) asServiceAccount(user string) kubernetes.Interface {
	rest, _ := strings.CutPrefix(user, "system:serviceaccount:")
	ns, _, _ := strings.Cut(rest, ":")
	return s.as(user, "system:serviceaccounts", "system:serviceaccounts:"+ns, "system:authenticated")
}

// asKubelet impersonates the kubelet of node, as the Node authorizer and
// NodeRestriction identify it.
func (s *apiServer) asKubelet(node string) kubernetes.Interface {
	return s.as("system:node:"+node, "system:nodes", "system:authenticated")
}

// anonymousClient trusts the server's serving CA and sends no credential.
func (s *apiServer) anonymousClient() (*http.Client, error) {
	pemData, err := os.ReadFile(s.caFile)
	if err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, errors.New("test/kube: serving CA holds no certificate")
	}
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}, nil
}

// getAnonymous GETs a path on the server without credentials.
func (s *apiServer) getAnonymous(ctx context.Context, path string) (int, []byte, error) {
	hc, err := s.anonymousClient()
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+path, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("test/kube: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("test/kube: GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
}

// allowAnonymousDiscovery binds system:service-account-issuer-discovery to
// system:unauthenticated (DL-440 self-host guide, first option) and waits
// until discovery and JWKS answer without credentials.
func (s *apiServer) allowAnonymousDiscovery(ctx context.Context) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "service-account-issuer-discovery-unauthenticated"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:service-account-issuer-discovery"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:unauthenticated"}},
	}
	if _, err := s.cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("test/kube: discovery binding: %w", err)
	}
	return s.waitAnonymousDiscovery(ctx)
}

func (s *apiServer) waitAnonymousDiscovery(ctx context.Context) error {
	var last string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		for _, p := range []string{"/.well-known/openid-configuration", "/openid/v1/jwks"} {
			code, _, err := s.getAnonymous(ctx, p)
			if err != nil || code != http.StatusOK {
				last = fmt.Sprintf("GET %s: status %d, %v", p, code, err)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("test/kube: %s: anonymous discovery never became readable (%s): %w", s.name, last, err)
	}
	return nil
}

// poll re-checks cond until it is true, it fails, or settleTimeout passes.
func poll(ctx context.Context, cond func(ctx context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, pollInterval, settleTimeout, true, cond)
}

func (s *apiServer) createNode(ctx context.Context, name string) (*corev1.Node, error) {
	n, err := s.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("test/kube: node %s: %w", name, err)
	}
	return n, nil
}

// tokenFor asks TokenRequest for a token of ServiceAccount sa, bound to pod
// when pod is non-nil, through client cs.
func tokenFor(ctx context.Context, cs kubernetes.Interface, sa string, pod *corev1.Pod, audience string) (string, error) {
	exp := int64(tokenSeconds)
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: &exp}}
	if pod != nil {
		tr.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	out, err := cs.CoreV1().ServiceAccounts(runnerNS).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return out.Status.Token, nil
}

// reviewToken asks the API server itself who token is, for audiences (nil: the
// API audiences). It shows a token the verifier refuses is nonetheless genuine.
func (s *apiServer) reviewToken(ctx context.Context, token string, audiences ...string) (authnv1.TokenReviewStatus, error) {
	tr, err := s.cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.TokenReviewStatus{}, fmt.Errorf("test/kube: token review: %w", err)
	}
	return tr.Status, nil
}

// jwtPart decodes the header (0) or claims (1) of a compact JWS without
// verifying it. Test failures print field names, never the token.
func jwtPart(t *testing.T, token string, i int) map[string]any {
	t.Helper()
	parts := bytes.Split([]byte(token), []byte("."))
	if len(parts) != 3 {
		t.Fatalf("token has %d segments, want 3", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(string(parts[i]))
	if err != nil {
		t.Fatalf("segment %d is not base64url: %v", i, err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("segment %d is not a JSON object: %v", i, err)
	}
	return m
}
