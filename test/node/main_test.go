//go:build nodetier

package node

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/deploytest"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/test/natsembed"
)

// The deployment's fixed names and the tier's choices.
const (
	clusterName = "node"
	runnerNS    = "compass-runner"
	systemNS    = "compass-system"
	// deployer is the identity the deployment is applied as: DL-440's
	// default deployers list names Flux's kustomize-controller, and a Flux
	// install binds it to cluster-admin.
	deployer  = "system:serviceaccount:flux-system:kustomize-controller"
	caConfig  = "compass-ca"
	caMount   = "/etc/compass/ca/ca.crt"
	serverSvc = "compass-server." + systemNS + ".svc"
)

// env is the node .ci/node.sh started (its DIR/env file, in the environment).
type env struct {
	dir, nodeName, nodeIP, issuer string
	caFile, caKeyFile, kubectl    string
	ctr, containerdSock           string
	volumes, natsImage, podCIDR   string
	images                        map[string]string // program -> reference by digest
	cfg                           *rest.Config
	cs                            kubernetes.Interface
}

var (
	theEnv   *env
	envErr   error
	deployMu sync.Mutex
	deployed *deployment
	deplErr  error
)

func TestMain(m *testing.M) {
	theEnv, envErr = loadEnv()
	if envErr != nil {
		// Never a skip: the package is built only by .ci/node.sh, which
		// starts the node first.
		fmt.Fprintf(os.Stderr, "test/node: %v (run the tier with bash .ci/node.sh test)\n", envErr)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func loadEnv() (*env, error) {
	get := func(k string) (string, error) {
		v := os.Getenv(k)
		if v == "" {
			return "", fmt.Errorf("%s is not set", k)
		}
		return v, nil
	}
	e := &env{images: map[string]string{}}
	var errs []error
	for _, f := range []struct {
		k string
		p *string
	}{
		{"COMPASS_NODE_DIR", &e.dir}, {"COMPASS_NODE_NAME", &e.nodeName}, {"COMPASS_NODE_IP", &e.nodeIP},
		{"COMPASS_NODE_ISSUER", &e.issuer}, {"COMPASS_NODE_CA", &e.caFile}, {"COMPASS_NODE_CA_KEY", &e.caKeyFile},
		{"COMPASS_NODE_KUBECTL", &e.kubectl}, {"COMPASS_NODE_CTR", &e.ctr}, {"COMPASS_NODE_CONTAINERD", &e.containerdSock},
		{"COMPASS_NODE_VOLUMES", &e.volumes}, {"COMPASS_NODE_NATS_IMAGE", &e.natsImage}, {"COMPASS_NODE_POD_CIDR", &e.podCIDR},
	} {
		v, err := get(f.k)
		errs = append(errs, err)
		*f.p = v
	}
	digests, err := get("COMPASS_NODE_IMAGES")
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(digests)
	if err != nil {
		return nil, fmt.Errorf("test/node: images: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		ref, digest, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("test/node: images: line %q is not \"<reference> <digest>\"", line)
		}
		repo := ref[:strings.LastIndex(ref, ":")]
		e.images[repo[strings.LastIndex(repo, "/")+1:]] = repo + "@" + digest
	}
	e.cfg, err = clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		return nil, fmt.Errorf("test/node: kubeconfig: %w", err)
	}
	e.cs, err = kubernetes.NewForConfig(e.cfg)
	if err != nil {
		return nil, fmt.Errorf("test/node: client: %w", err)
	}
	return e, nil
}

// as is a client impersonating user (with groups).
func (e *env) as(user string, groups ...string) kubernetes.Interface {
	c := rest.CopyConfig(e.cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return kubernetes.NewForConfigOrDie(c)
}

// kubectlRun runs kubectl with the admin kubeconfig; stdin may be nil. The
// output is returned, never logged: a minted token comes back this way.
func (e *env) kubectlRun(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.kubectl, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("test/node: kubectl %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// deployment is the rendered deployment, applied and answering.
type deployment struct {
	manifests  []byte
	workloads  []workload
	adminToken string
	runnerID   string
	// Phase timings, from the apply to the first answered ping.
	applied, allReady, firstPong time.Duration
	admin                        adminv1connect.AdminServiceClient
}

// theDeployment applies the deployment once for the package's tests, as
// docs/self-host.md tells an operator to, and waits for the first pong.
func theDeployment(t *testing.T) *deployment {
	t.Helper()
	deployMu.Lock()
	defer deployMu.Unlock()
	if deployed == nil && deplErr == nil {
		deployed, deplErr = theEnv.apply(t)
		if deplErr == nil {
			t.Logf("deployment: applied in %s, every pod ready %s after the apply, first pong %s after the apply",
				deployed.applied.Round(time.Millisecond), deployed.allReady.Round(time.Millisecond), deployed.firstPong.Round(time.Millisecond))
		}
	}
	if deplErr != nil {
		t.Fatalf("deployment: %v", deplErr)
	}
	return deployed
}

func (e *env) apply(t *testing.T) (_ *deployment, err error) {
	ctx := context.Background()
	d := &deployment{runnerID: clusterName + "/" + strings.ReplaceAll(e.nodeName, ".", "_")}
	k, err := e.prepare(ctx, true, nil)
	if err != nil {
		return nil, err
	}
	p := e.params(k)
	p.CABundleConfigMap = caConfig
	d.manifests, err = deploy.Render(p)
	if err != nil {
		return nil, err
	}
	if err := e.setupThreat(ctx); err != nil {
		return nil, fmt.Errorf("test/node: the threat proof's setup: %w", err)
	}

	start := time.Now()
	if out, err := e.kubectlRun(ctx, d.manifests, "apply", "--server-side", "--field-manager=compass-node-tier", "--as="+deployer, "-f", "-"); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, out)
	}
	d.applied = time.Since(start)

	// Every workload ready, then the first answered ping.
	if d.workloads, err = renderedWorkloads(d.manifests); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 5*time.Minute, "every workload ready", func() (bool, error) { return e.allReady(ctx, d.workloads) }); err != nil {
		return nil, errors.Join(err, e.podSummary(ctx))
	}
	d.allReady = time.Since(start)
	tok, err := e.kubectlRun(ctx, nil, "-n", systemNS, "exec", "compass-server-0", "-c", "server", "--", "compass-server", "mint-account-token", "--name", "node-tier", "--ttl", "2h")
	if err != nil {
		return nil, err
	}
	d.adminToken = strings.TrimSpace(tok)
	hc, err := e.doorClient(ctx)
	if err != nil {
		return nil, err
	}
	d.admin = adminv1connect.NewAdminServiceClient(hc, doorURL, connect.WithGRPC())
	if err := waitFor(ctx, 2*time.Minute, "the first pong", func() (bool, error) {
		_, err := d.ping(ctx, d.runnerID)
		return err == nil, nil
	}); err != nil {
		return nil, errors.Join(err, e.podSummary(ctx))
	}
	d.firstPong = time.Since(start)
	return d, nil
}

// operatorKeys are the keys, passwords and CA an operator makes before the
// install (deploy/nats/README.md, docs/self-host.md). Seeds stay here and in
// the Secrets; nothing logs them.
type operatorKeys struct {
	accountSeed, xkeySeed []byte
	accountPub, xkeyPub   string
	caPEM                 []byte
	// nats is NATS's operator mode, when the install runs it: the
	// recipe's operator, accounts and users, and the callout's keys.
	nats *natsOperator
}

// natsOperator is operator mode as deploy/nats/README.md makes it
// (natsembed.Recipe stands in for nsc) and the callout's current keys.
type natsOperator struct {
	recipe *natsembed.Recipe
	keys   natsembed.CalloutKeys
	// The seeds of keys, as the callout's Secrets hold them.
	xkeySeed, issuerSeed, userSigningSeed []byte
}

func newNATSOperator(t *testing.T) *natsOperator {
	t.Helper()
	op := &natsOperator{recipe: natsembed.NewRecipe(t), keys: natsembed.NewCalloutKeys(t)}
	op.xkeySeed, op.issuerSeed, op.userSigningSeed = op.keys.Seeds(t)
	return op
}

// prepare creates what the install references, as docs/self-host.md tells
// an operator to, before it: the namespaces an operator owns, the deployer's
// binding, the Secrets, the cluster file's ConfigMap and the SQLite Server's
// volume. With caConfigMaps the CA bundle is ConfigMap compass-ca in both
// namespaces, which the rendered stream references (--ca-configmap), and the
// Runner's namespace is made here too; without it the chart renders the CA
// from the caBundle value and owns the Runner's namespace.
//
// With op, NATS runs in operator mode (docs/self-host.md, "Operator mode
// through the chart"): the callout's Secrets hold op's seeds and the
// recipe's .creds files, compass-server's its .creds, and there is no
// compass-nats-users (the users are JWTs).
func (e *env) prepare(ctx context.Context, caConfigMaps bool, op *natsOperator) (*operatorKeys, error) {
	k := &operatorKeys{nats: op}
	account, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	k.accountSeed, _ = account.Seed()
	k.accountPub, _ = account.PublicKey()
	xkey, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, err
	}
	k.xkeySeed, _ = xkey.Seed()
	k.xkeyPub, _ = xkey.PublicKey()
	pw := func() string {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}
	calloutPW, kickPW, serverPW, routePW := pw(), pw(), pw(), pw()

	ca, caKey, caPEM, err := e.loadCA()
	if err != nil {
		return nil, err
	}
	k.caPEM = caPEM
	serverCert, err := issue(ca, caKey, []string{serverSvc, serverSvc + ".cluster.local", "compass-server"}, false)
	if err != nil {
		return nil, err
	}
	natsCert, err := issue(ca, caKey, []string{"nats." + systemNS + ".svc", "nats." + systemNS + ".svc.cluster.local", "*.nats-headless." + systemNS + ".svc"}, false)
	if err != nil {
		return nil, err
	}
	routeCert, err := issue(ca, caKey, []string{"*.nats-headless." + systemNS + ".svc", "*.nats-headless." + systemNS + ".svc.cluster.local"}, true)
	if err != nil {
		return nil, err
	}

	clusters := fmt.Sprintf("clusters:\n  - name: %s\n    issuer: %q\n    caFile: %q\n", clusterName, e.issuer, caMount)
	namespaces := []string{systemNS, "flux-system"}
	if caConfigMaps {
		namespaces = append(namespaces, runnerNS)
	}
	for _, ns := range namespaces {
		if _, err := e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	}
	if _, err := e.kubectlRun(ctx, nil, "create", "clusterrolebinding", "flux-kustomize-controller", "--clusterrole=cluster-admin",
		"--serviceaccount=flux-system:kustomize-controller"); err != nil {
		return nil, err
	}
	cm := func(ns, name string, data map[string]string) error {
		_, err := e.cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{})
		return err
	}
	secret := func(name string, typ corev1.SecretType, data map[string][]byte) error {
		_, err := e.cs.CoreV1().Secrets(systemNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: typ, Data: data}, metav1.CreateOptions{})
		return err
	}
	// compass-nats-users holds bcrypt hashes, as docs/self-host.md makes it
	// with compass-server nats-password-hash (the same function).
	hashes := map[string][]byte{}
	for key, pw := range map[string]string{"callout-password": calloutPW, "server-password": serverPW, "kick-password": kickPW} {
		h, err := deploy.NATSPasswordHash(pw)
		if err != nil {
			return nil, fmt.Errorf("test/node: %s: %w", key, err)
		}
		hashes[key] = []byte(h + "\n")
	}
	// Each secret(...) creates its Secret when called: one mode's list only.
	var users []error
	if op == nil {
		users = []error{
			secret("compass-callout-signing", corev1.SecretTypeOpaque, map[string][]byte{"seed": k.accountSeed}),
			secret("compass-callout-xkey", corev1.SecretTypeOpaque, map[string][]byte{"seed": k.xkeySeed}),
			secret("compass-callout-nats", corev1.SecretTypeOpaque, map[string][]byte{"password": []byte(calloutPW), "kick-password": []byte(kickPW)}),
			secret(deploy.NATSUsersSecret, corev1.SecretTypeOpaque, hashes),
			secret(deploy.ServerNATSSecret, corev1.SecretTypeOpaque, map[string][]byte{"password": []byte(serverPW)}),
		}
	} else {
		k.xkeySeed, k.accountSeed = op.xkeySeed, op.issuerSeed
		users = []error{
			secret("compass-callout-signing", corev1.SecretTypeOpaque, map[string][]byte{"seed": op.issuerSeed}),
			secret("compass-callout-xkey", corev1.SecretTypeOpaque, map[string][]byte{"seed": op.xkeySeed}),
			secret("compass-callout-user-signing", corev1.SecretTypeOpaque, map[string][]byte{"seed": op.userSigningSeed}),
			secret("compass-callout-nats", corev1.SecretTypeOpaque, map[string][]byte{"creds": op.recipe.CalloutCreds(), "kick-creds": op.recipe.KickCreds()}),
			secret(deploy.ServerNATSSecret, corev1.SecretTypeOpaque, map[string][]byte{"creds": op.recipe.ServerCreds()}),
		}
	}
	objs := append(users,
		cm(systemNS, deploy.RunnerClustersConfigMap, map[string]string{"clusters.yaml": clusters}),
		secret(deploy.NATSRouteSecret, corev1.SecretTypeOpaque, map[string][]byte{"password": []byte(routePW)}),
		secret(deploy.DefaultNATSTLSSecret, corev1.SecretTypeTLS, map[string][]byte{"tls.crt": natsCert.cert, "tls.key": natsCert.key}),
		secret(deploy.DefaultNATSRouteTLSSecret, corev1.SecretTypeOpaque, map[string][]byte{"tls.crt": routeCert.cert, "tls.key": routeCert.key, "ca.crt": caPEM}),
		secret(deploy.DefaultServerTLSSecret, corev1.SecretTypeTLS, map[string][]byte{"tls.crt": serverCert.cert, "tls.key": serverCert.key}),
	)
	if caConfigMaps {
		objs = append(objs, cm(runnerNS, caConfig, map[string]string{"ca.crt": string(caPEM)}), cm(systemNS, caConfig, map[string]string{"ca.crt": string(caPEM)}))
	}
	if err := errors.Join(objs...); err != nil {
		return nil, fmt.Errorf("test/node: the referenced objects: %w", err)
	}
	// The SQLite Server's claim: this node has no provisioner, so a
	// PersistentVolume on the node's disk, as an operator of such a cluster
	// makes one. The directory belongs to the pods' user (65532): a hostPath
	// volume is not chowned for fsGroup.
	if err := e.serverVolume(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// params are the render's: DL-440's defaults with this cluster's name and
// addresses, the locally built images by digest and a three-node NATS.
func (e *env) params(k *operatorKeys) deploy.Params {
	p := deploy.DefaultParams()
	p.ClusterName = clusterName
	p.ServerURL = "https://" + serverSvc + ":8443"
	p.NATSURL = "tls://nats." + systemNS + ".svc:4222"
	p.RunnerImage = e.images["compass-runner"]
	p.CalloutImage = e.images["compass-callout"]
	p.ServerImage = e.images["compass-server"]
	p.NATSImage = e.natsImage
	p.NATSCluster = true
	p.NATSCalloutIssuer = k.accountPub
	p.NATSCalloutXKey = k.xkeyPub
	if k.nats != nil {
		// Operator mode: the account JWTs name the callout's keys, and
		// --nats-account is the RUNNERS account's public key.
		p.NATSCalloutIssuer, p.NATSCalloutXKey = "", ""
		p.NATSAccount = k.nats.recipe.RunnersPub
	}
	return p
}

// operatorValues are the chart values operator mode adds
// (docs/self-host.md, "Operator mode through the chart"): the mode, the
// callout account, and what nsc made, the resolver block (as helm
// --set-file nats.operator.resolver=resolver.conf gives it) and the
// sentinel's JWT.
func (op *natsOperator) values(t *testing.T, resolver string) map[string]any {
	t.Helper()
	return map[string]any{
		"callout": map[string]any{"mode": "operator", "calloutAccount": op.recipe.AuthPub},
		"nats":    map[string]any{"operator": map[string]any{"resolver": resolver, "sentinel": op.recipe.Sentinel()}},
	}
}

func (e *env) serverVolume(ctx context.Context) error {
	dir := filepath.Join(e.volumes, "compass-server-data")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chown(dir, 65532, 65532); err != nil {
		return err
	}
	typ := corev1.HostPathDirectory
	_, err := e.cs.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "compass-server-data"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: mustQuantity(deploy.DefaultServerStorage)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &typ}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: systemNS, Name: "data-compass-server-0"},
		},
	}, metav1.CreateOptions{})
	return err
}

// workload is a rendered DaemonSet, Deployment or StatefulSet: what the
// tier waits for, read from the render itself, so a change of topology in
// deploy (the callout beside the Server, say) changes what is waited for.
type workload struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Replicas *int32 `json:"replicas"`
		Template struct {
			Spec struct {
				Containers []struct {
					Name  string `json:"name"`
					Image string `json:"image"`
				} `json:"containers"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

func renderedWorkloads(manifests []byte) ([]workload, error) {
	docs, err := deploytest.Documents(manifests)
	if err != nil {
		return nil, fmt.Errorf("test/node: manifests: %w", err)
	}
	var out []workload
	for _, doc := range docs {
		var w workload
		if err := yaml.Unmarshal(doc, &w); err != nil {
			return nil, fmt.Errorf("test/node: manifests: %w", err)
		}
		switch w.Kind {
		case "DaemonSet", "Deployment", "StatefulSet":
			out = append(out, w)
		}
	}
	return out, nil
}

// allReady: every rendered workload has all its pods ready (the DaemonSet
// one, on the one node).
func (e *env) allReady(ctx context.Context, ws []workload) (bool, error) {
	for _, w := range ws {
		want := int32(1)
		if w.Spec.Replicas != nil {
			want = *w.Spec.Replicas
		}
		var ready int32
		apps := e.cs.AppsV1()
		switch w.Kind {
		case "DaemonSet":
			o, err := apps.DaemonSets(w.Metadata.Namespace).Get(ctx, w.Metadata.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			ready = o.Status.NumberReady
		case "Deployment":
			o, err := apps.Deployments(w.Metadata.Namespace).Get(ctx, w.Metadata.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			ready = o.Status.ReadyReplicas
		case "StatefulSet":
			o, err := apps.StatefulSets(w.Metadata.Namespace).Get(ctx, w.Metadata.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			ready = o.Status.ReadyReplicas
		}
		if ready != want {
			return false, nil
		}
	}
	return true, nil
}

// podSummary says where each pod is, for a failed wait.
func (e *env) podSummary(ctx context.Context) error {
	var b strings.Builder
	for _, ns := range []string{runnerNS, systemNS} {
		pods, err := e.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			fmt.Fprintf(&b, "\n  %s/%s: %s", ns, p.Name, p.Status.Phase)
			for _, c := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				fmt.Fprintf(&b, " [%s ready=%t restarts=%d", c.Name, c.Ready, c.RestartCount)
				if c.State.Waiting != nil {
					fmt.Fprintf(&b, " waiting %s: %s", c.State.Waiting.Reason, c.State.Waiting.Message)
				}
				if c.LastTerminationState.Terminated != nil {
					fmt.Fprintf(&b, " last exit %d %s", c.LastTerminationState.Terminated.ExitCode, c.LastTerminationState.Terminated.Reason)
				}
				b.WriteString("]")
			}
		}
		evs, err := e.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, ev := range evs.Items {
				if ev.Type == corev1.EventTypeWarning {
					fmt.Fprintf(&b, "\n  event %s/%s %s: %s", ns, ev.InvolvedObject.Name, ev.Reason, ev.Message)
				}
			}
		}
	}
	return errors.New("pods:" + b.String())
}

// doorClient reaches the Server's door from the host through its Service:
// the ClusterIP, translated by kube-proxy, with the certificate checked for
// the Service's name.
func (e *env) doorClient(ctx context.Context) (*http.Client, error) {
	svc, err := e.cs.CoreV1().Services(systemNS).Get(ctx, deploy.ServerName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(e.caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "8443")
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}, nil
}

const doorURL = "https://" + serverSvc + ":8443"

func (e *env) runnerClient(ctx context.Context) (runnerv1connect.RunnerServiceClient, error) {
	hc, err := e.doorClient(ctx)
	if err != nil {
		return nil, err
	}
	return runnerv1connect.NewRunnerServiceClient(hc, doorURL, connect.WithGRPC()), nil
}

// runCmd runs a program and returns its standard output.
func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("test/node: %s %s: %w: %s", filepath.Base(name), args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// ping asks the Server to ping the Runner; it returns the answer's JSON.
func (d *deployment) ping(ctx context.Context, runnerID string) (string, error) {
	req := connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: runnerID})
	req.Header().Set("Authorization", "Bearer "+d.adminToken)
	res, err := d.admin.PingRunner(ctx, req)
	if err != nil {
		return "", err
	}
	ans := res.Msg.GetAnswerJson()
	if !strings.Contains(ans, `"ok":true`) {
		return ans, fmt.Errorf("test/node: ping %s: answer %s", runnerID, ans)
	}
	return ans, nil
}

// waitFor polls cond every 200 ms until it holds, fails, or limit passes.
func waitFor(ctx context.Context, limit time.Duration, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("test/node: waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("test/node: %s not reached within %s", what, limit)
		case <-tick.C:
		}
	}
}

// ---- certificates signed by the node's CA

type pair struct{ cert, key []byte }

func (e *env) loadCA() (*x509.Certificate, crypto.Signer, []byte, error) {
	caPEM, err := os.ReadFile(e.caFile)
	if err != nil {
		return nil, nil, nil, err
	}
	b, _ := pem.Decode(caPEM)
	if b == nil {
		return nil, nil, nil, errors.New("test/node: CA: no PEM block")
	}
	ca, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, nil, nil, err
	}
	keyPEM, err := os.ReadFile(e.caKeyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, nil, errors.New("test/node: CA key: no PEM block")
	}
	var key any
	if key, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
		if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			return nil, nil, nil, fmt.Errorf("test/node: CA key: %w", err)
		}
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, nil, errors.New("test/node: CA key is not a signer")
	}
	return ca, signer, caPEM, nil
}

func issue(ca *x509.Certificate, caKey crypto.Signer, dns []string, client bool) (pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return pair{}, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	if client {
		usage = append(usage, x509.ExtKeyUsageClientAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: dns[0]},
		DNSNames:     dns,
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return pair{}, err
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return pair{}, err
	}
	return pair{pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})}, nil
}

// ---- the Runner pod

// runnerPod is the DaemonSet's running pod.
func (e *env) runnerPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := e.cs.CoreV1().Pods(runnerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=compass-runner"})
	if err != nil {
		return nil, err
	}
	var found *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			if found != nil {
				return nil, fmt.Errorf("test/node: two running Runner pods, %s and %s", found.Name, p.Name)
			}
			found = p
		}
	}
	if found == nil {
		return nil, errors.New("test/node: no running Runner pod")
	}
	return found, nil
}

// tokenFile is where the kubelet writes pod's projected Runner token on the
// node (the host's view of the volume the container reads).
func (e *env) tokenFile(pod *corev1.Pod) string {
	return filepath.Join(e.dir, "kubelet", "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "compass-runner-token", "token")
}

// logs are a container's log lines, each a JSON object or not.
func (e *env) logs(ctx context.Context, ns, pod, container string) ([]string, error) {
	out, err := e.kubectlRun(ctx, nil, "-n", ns, "logs", pod, "-c", container)
	if err != nil {
		return nil, err
	}
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}
