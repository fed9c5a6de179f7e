package kube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/compass-runner/identity/verifier"
)

// The live cluster is shared by the tests that only read it; tests that
// restart a server or change its admission state start their own.
var shared struct {
	mu      sync.Mutex
	started bool
	env     *liveEnv
	err     error
}

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // envtest logs through controller-runtime
	code := m.Run()
	if shared.env != nil {
		if err := shared.env.close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// liveEnv is cluster "live": one API server with the Runner manifests applied
// (policy included), nodes ip-10-0-1-5 and ip-10-0-1-6, and a Runner pod bound
// to ip-10-0-1-5.ec2.internal.
type liveEnv struct {
	dir         string
	key         *saKey
	srv         *apiServer
	node        *corev1.Node
	pod         *corev1.Pod
	clusterFile string
}

// liveCluster returns the shared live cluster, starting it on first use.
func liveCluster(t *testing.T) *liveEnv {
	t.Helper()
	assets := requireBinaries(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.started {
		shared.started = true
		start := time.Now()
		shared.env, shared.err = setupLive(t.Context(), assets)
		t.Logf("live cluster ready in %s", time.Since(start).Round(time.Millisecond))
	}
	if shared.err != nil {
		t.Fatalf("live cluster: %v", shared.err)
	}
	return shared.env
}

func setupLive(ctx context.Context, assets string) (_ *liveEnv, err error) {
	e, err := newEnv(ctx, assets, "live", true)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = e.close()
		}
	}()
	if e.pod, err = e.srv.createRunnerPod(ctx, runnerNode); err != nil {
		return nil, err
	}
	return e, nil
}

// newEnv starts a cluster named name with an RSA signing key, creates the two
// nodes, applies the Runner manifests (the policy only when withPolicy), and
// writes a cluster file registering it as "live".
func newEnv(ctx context.Context, assets, name string, withPolicy bool) (_ *liveEnv, err error) {
	dir, err := os.MkdirTemp("", "compass-kube-"+name+"-")
	if err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	e := &liveEnv{dir: dir}
	defer func() {
		if err != nil {
			_ = e.close()
		}
	}()
	if e.key, err = newRSAKey(dir, name+"-sa-1"); err != nil {
		return nil, err
	}
	if e.srv, err = startAPIServer(ctx, assets, serverSpec{name: name, signing: e.key}, dir); err != nil {
		return nil, err
	}
	if e.node, err = e.srv.createNode(ctx, runnerNode); err != nil {
		return nil, err
	}
	if _, err = e.srv.createNode(ctx, otherNode); err != nil {
		return nil, err
	}
	if err := e.srv.deployRunner(ctx, withPolicy); err != nil {
		return nil, err
	}
	e.clusterFile = filepath.Join(dir, "clusters.yaml")
	if err := os.WriteFile(e.clusterFile, []byte(clusterFileFor("live", e.srv.issuer, "", e.srv.caFile)), 0o600); err != nil {
		return nil, fmt.Errorf("test/kube: %w", err)
	}
	return e, nil
}

func (e *liveEnv) close() error {
	var errs []error
	if e.srv != nil {
		errs = append(errs, e.srv.stop())
	}
	errs = append(errs, os.RemoveAll(e.dir))
	return errors.Join(errs...)
}

// clusterFileFor is a one-cluster file in DL-440's format.
func clusterFileFor(name, issuer, jwksURI, caFile string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "clusters:\n  - name: %s\n    issuer: %q\n    caFile: %q\n", name, issuer, caFile)
	if jwksURI != "" {
		fmt.Fprintf(&b, "    jwksURI: %q\n", jwksURI)
	}
	return b.String()
}

// newVerifier builds a verifier from a cluster file, as the Server does, with
// the real clock (the tokens are real) and opts.
func newVerifier(t *testing.T, clusterFile string, opts ...verifier.Option) *verifier.RunnerVerifier {
	t.Helper()
	data, err := os.ReadFile(clusterFile)
	if err != nil {
		t.Fatal(err)
	}
	clusters, err := verifier.ParseRunnerClusters(data)
	if err != nil {
		t.Fatalf("cluster file: %v", err)
	}
	v, err := verifier.New(clusters, append([]verifier.Option{verifier.WithTenant("bootstrap")}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return v
}

// loadedVerifier is newVerifier with every key set fetched.
func loadedVerifier(t *testing.T, clusterFile string, opts ...verifier.Option) *verifier.RunnerVerifier {
	t.Helper()
	v := newVerifier(t, clusterFile, opts...)
	if err := v.Refresh(t.Context()); err != nil {
		t.Fatalf("verifier key fetch: %v", err)
	}
	return v
}

// deployRunner applies the Runner manifests as the deployers identity; with
// withPolicy it applies the admission policy too and waits until it denies.
func (s *apiServer) deployRunner(ctx context.Context, withPolicy bool) error {
	if err := s.bindDeployer(ctx); err != nil {
		return err
	}
	data, err := runnerManifests()
	if err != nil {
		return err
	}
	objs, err := splitManifests(data)
	if err != nil {
		return err
	}
	if err := s.applyManifests(ctx, objs, func(u *unstructured.Unstructured) bool { return !isPolicy(u) }); err != nil {
		return err
	}
	if !withPolicy {
		return nil
	}
	return s.applyPolicy(ctx, objs)
}

// applyPolicy applies the policy objects among objs and waits until both
// policies deny: DL-440's compass-runner-identity and DL-456's
// compass-runner-containment.
func (s *apiServer) applyPolicy(ctx context.Context, objs []*unstructured.Unstructured) error {
	if err := s.applyManifests(ctx, objs, isPolicy); err != nil {
		return err
	}
	probes := []struct {
		policy, msg string
		probe       func(context.Context) error
	}{
		{policyName, msgPodOwner, s.probePolicy},
		{containmentPolicyName, msgNodesGroup, s.probeContainment},
	}
	for _, p := range probes {
		var last error
		err := poll(ctx, func(ctx context.Context) (bool, error) {
			last = p.probe(ctx)
			return last != nil, nil
		})
		if err != nil {
			return fmt.Errorf("test/kube: the admission policy %s never became active: %w", p.policy, err)
		}
		if !isDeniedBy(last, p.policy, p.msg) {
			return fmt.Errorf("test/kube: policy %s probe failed for another reason: %w", p.policy, last)
		}
	}
	return nil
}

// probePolicy dry-run creates, as the admin, a pod with the Runner
// ServiceAccount and no owner: admitted without the policy, denied with it.
func (s *apiServer) probePolicy(ctx context.Context) error {
	_, err := s.cs.CoreV1().Pods(runnerNS).Create(ctx, plainPod("policy-probe", runnerSA, ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// probeContainment asks, as an admin under a kubelet's username but outside
// the system:nodes group, for an unbound Runner token of a probe audience:
// DL-440's policy admits the username, DL-456's refuses the missing group.
// Before the policy is active the API server issues the token, which is
// thrown away (its audience is accepted nowhere).
func (s *apiServer) probeContainment(ctx context.Context) error {
	_, err := tokenFor(ctx, s.as("system:node:policy-probe", "system:masters", "system:authenticated"), runnerSA, nil, "policy-probe")
	return err
}

// plainPod is a minimal pod using ServiceAccount sa, bound to node if set. It
// meets the restricted Pod Security Standard, which the rendered namespace
// enforces.
func plainPod(name, sa, node string) *corev1.Pod {
	no, yes := false, true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: runnerNS},
		Spec: corev1.PodSpec{
			ServiceAccountName:           sa,
			AutomountServiceAccountToken: &no,
			NodeName:                     node,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   &yes,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "c",
				Image: "example.invalid/none:1",
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no,
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// The policies' names and messages (DL-440, DL-456).
const (
	policyName            = "compass-runner-identity"
	containmentPolicyName = "compass-runner-containment"

	msgTokenKubelet = "only kubelets may request a compass-runner token"
	msgPodOwner     = "compass-runner pods must come from the compass-runner DaemonSet"
	msgOnlyDS       = "only the compass-runner DaemonSet may use the compass-runner ServiceAccount"
	msgDeployer     = "only a deployer may create or change the compass-runner DaemonSet"

	msgNodesGroup = "only kubelets (group system:nodes) may request a compass-runner token"
	msgPodSpec    = "a compass-runner pod's spec cannot be changed: a deployer changes the compass-runner DaemonSet, whose controller replaces the pods"
	msgPodOwners  = "only the controllers may change a compass-runner pod's labels or owners: a pod released from the DaemonSet would keep the node's identity beside its replacement"
	msgEphemeral  = "ephemeral containers cannot be added to a compass-runner pod: they could mount its token"
	msgConnect    = "exec, attach and port-forward are refused on compass-runner pods: a session in the pod could use the node's Runner token"
)

// isPolicyDenial reports whether err is the policy compass-runner-identity
// denying a request with message msg.
func isPolicyDenial(err error, msg string) bool {
	return isDeniedBy(err, policyName, msg)
}

// isAnyPolicyDenial reports whether either policy denied err.
func isAnyPolicyDenial(err error) bool {
	return isDeniedBy(err, policyName, "") || isDeniedBy(err, containmentPolicyName, "")
}

// isDeniedBy reports whether err is the ValidatingAdmissionPolicy policy
// denying a request with message msg.
func isDeniedBy(err error, policy, msg string) bool {
	if err == nil {
		return false
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	m := st.Status().Message
	return strings.Contains(m, "ValidatingAdmissionPolicy '"+policy+"'") && strings.Contains(m, msg)
}

// kubeletToken is the Runner pod's token as its kubelet obtains it
// (TokenRequest, audience compass-runner, 600 s, bound to the pod). The Node
// authorizer learns the pod from an informer, so the first requests may be
// forbidden; it retries until the deadline.
func kubeletToken(ctx context.Context, srv *apiServer, node string, pod *corev1.Pod) (string, error) {
	return kubeletTokenFor(ctx, srv, node, pod, runnerAudience)
}

// kubeletTokenFor is kubeletToken with another audience, which a kubelet may
// ask for too.
func kubeletTokenFor(ctx context.Context, srv *apiServer, node string, pod *corev1.Pod, audience string) (string, error) {
	cs := srv.asKubelet(node)
	var tok string
	var last error
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		tok, last = tokenFor(ctx, cs, runnerSA, pod, audience)
		if apierrors.IsForbidden(last) && !isAnyPolicyDenial(last) {
			return false, nil
		}
		return last == nil, last
	})
	if err != nil {
		return "", fmt.Errorf("test/kube: kubelet token request: %w (last: %v)", err, last)
	}
	return tok, nil
}
