package deploy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// testRoutePassword is what the tests put in Secret compass-nats-route: hex,
// as docs/self-host.md has it generated (openssl rand -hex 32), beginning with
// digits and an exponent-like "1e5", which nats-server's parser could read as
// a number if it were careless.
// gossipWait bounds each wait on what nats-server's own goroutines (route
// gossip, interest propagation) do, which expose no event to wait on.
const gossipWait = 15 * time.Second

const testRoutePassword = "1e5a0c9b7d2f4e6a8c0b1d3f5e7a9c2b4d6f8e0a1c3b5d7f9e2a4c6b8d0f1e3a"

// clusterParams are DefaultParams with an in-cluster NATS cluster of the
// default size and real public keys.
func clusterParams(t *testing.T, issuer, xkey string) Params {
	t.Helper()
	p := DefaultParams()
	p.NATSImage, p.NATSCluster = "nats:2.12.1-alpine", true
	p.NATSCalloutIssuer, p.NATSCalloutXKey = issuer, xkey
	return p
}

// natsContainer is the nats-server container of the cluster's StatefulSet.
func natsContainer(t *testing.T, p Params) corev1.Container {
	t.Helper()
	ss := only[*appsv1.StatefulSet](t, rendered(t, p), p.CalloutNamespace, "nats")
	return ss.Spec.Template.Spec.Containers[0]
}

// kubeletEnv resolves a container's environment as the kubelet does for
// what these manifests use: secretKeyRef from secrets (name/key), fieldRef
// from fields, and $(NAME) in a value from the variables defined before it
// ($$ is a literal $; an undefined reference stays as written).
func kubeletEnv(t *testing.T, c corev1.Container, secrets, fields map[string]string) map[string]string {
	t.Helper()
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(m string) string {
				if m == "$$" {
					return "$"
				}
				if v, ok := env[m[2:len(m)-1]]; ok {
					return v
				}
				return m
			})
		case e.ValueFrom.SecretKeyRef != nil:
			k := e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			v, ok := secrets[k]
			if !ok {
				t.Fatalf("env %s reads Secret key %s, which the test does not provide", e.Name, k)
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil:
			v, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("env %s reads field %s, which the test does not provide", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		default:
			t.Fatalf("env %s has a source the test does not know", e.Name)
		}
	}
	return env
}

// clusterPodEnv is pod nats-0's environment, resolved from the rendered
// StatefulSet with the test's Secrets.
func clusterPodEnv(t *testing.T, p Params, routePassword string) map[string]string {
	t.Helper()
	return kubeletEnv(t, natsContainer(t, p), secretsWithRoute(routePassword), map[string]string{"metadata.name": "nats-0"})
}

// secretsWithRoute are Secret compass-nats-users and the route password's
// Secret, as the kubelet reads them for a nats-server pod.
func secretsWithRoute(routePassword string) map[string]string {
	s := maps.Clone(usersSecret)
	s[NATSRouteSecret+"/password"] = routePassword
	return s
}

// setRouteEnv sets the route and server-name variables of pod nats-0's
// environment, resolved from the rendered StatefulSet, in the test's.
func setRouteEnv(t *testing.T, p Params, routePassword string) {
	t.Helper()
	env := clusterPodEnv(t, p, routePassword)
	for _, k := range []string{natsRoutePasswordEnv, natsRouteURLsEnv, natsServerNameEnv} {
		v, ok := env[k]
		if !ok {
			t.Fatalf("the StatefulSet's container has no %s", k)
		}
		t.Setenv(k, v)
	}
}

// processConfig loads conf with nats-server's own parser.
func processConfig(t *testing.T, conf []byte) *server.Options {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered configuration: %v", err)
	}
	return opts
}

func TestRender_NATSClusterObjects(t *testing.T) {
	p := clusterParams(t, "", "")
	p.CalloutNamespace = "compass-auth"
	objs := rendered(t, p)
	ss := only[*appsv1.StatefulSet](t, objs, p.CalloutNamespace, "nats")
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != DefaultNATSClusterReplicas {
		t.Fatalf("replicas = %v, want %d by default", ss.Spec.Replicas, DefaultNATSClusterReplicas)
	}
	if ss.Spec.ServiceName != "nats-headless" || ss.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Fatalf("serviceName %q, podManagementPolicy %q; want nats-headless, Parallel", ss.Spec.ServiceName, ss.Spec.PodManagementPolicy)
	}
	for k, v := range ss.Spec.Selector.MatchLabels {
		if ss.Spec.Template.Labels[k] != v {
			t.Fatalf("selector %s=%s does not match the pod labels", k, v)
		}
	}
	spec := ss.Spec.Template.Spec
	checkNoAPIToken(t, "StatefulSet nats", &spec)
	if aa := spec.Affinity; aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Fatalf("affinity = %+v, want the servers spread over nodes", spec.Affinity)
	}
	checkSecretMount(t, spec, "tls", natsTLSDir, p.NATSTLSSecret)
	checkSecretMount(t, spec, "route-tls", natsRouteTLSDir, p.NATSRouteTLSSecret)
	c := spec.Containers[0]
	var ports []string
	for _, cp := range c.Ports {
		ports = append(ports, fmt.Sprintf("%s/%d", cp.Name, cp.ContainerPort))
	}
	if want := []string{"client/4222", "cluster/6222"}; !slices.Equal(ports, want) {
		t.Fatalf("ports = %v, want %v", ports, want)
	}

	// The environment: the passwords by reference, the route URLs after the
	// route password they expand, naming every peer by its stable name.
	var order []string
	byName := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		order = append(order, e.Name)
		byName[e.Name] = e
	}
	if want := []string{"COMPASS_CALLOUT_NATS_PASSWORD", "COMPASS_SERVER_NATS_PASSWORD", "COMPASS_KICK_NATS_PASSWORD", natsServerNameEnv, natsRoutePasswordEnv, natsRouteURLsEnv}; !slices.Equal(order, want) {
		t.Fatalf("env order = %v, want %v", order, want)
	}
	if r := byName[natsRoutePasswordEnv].ValueFrom; r == nil || r.SecretKeyRef == nil || r.SecretKeyRef.Name != NATSRouteSecret || r.SecretKeyRef.Key != "password" ||
		(r.SecretKeyRef.Optional != nil && *r.SecretKeyRef.Optional) {
		t.Fatalf("%s = %+v, want Secret %s key password, required", natsRoutePasswordEnv, r, NATSRouteSecret)
	}
	if f := byName[natsServerNameEnv].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "metadata.name" {
		t.Fatalf("%s = %+v, want the pod's name", natsServerNameEnv, f)
	}
	wantURLs := `["tls://compass-route:$(COMPASS_NATS_ROUTE_PASSWORD)@nats-0.nats-headless.compass-auth.svc:6222", ` +
		`"tls://compass-route:$(COMPASS_NATS_ROUTE_PASSWORD)@nats-1.nats-headless.compass-auth.svc:6222", ` +
		`"tls://compass-route:$(COMPASS_NATS_ROUTE_PASSWORD)@nats-2.nats-headless.compass-auth.svc:6222"]`
	if got := byName[natsRouteURLsEnv].Value; got != wantURLs {
		t.Fatalf("%s = %s\nwant %s", natsRouteURLsEnv, got, wantURLs)
	}

	hl := only[*corev1.Service](t, objs, p.CalloutNamespace, "nats-headless")
	if hl.Spec.ClusterIP != corev1.ClusterIPNone || !hl.Spec.PublishNotReadyAddresses {
		t.Fatalf("headless Service clusterIP %q, publishNotReadyAddresses %v; want None, true", hl.Spec.ClusterIP, hl.Spec.PublishNotReadyAddresses)
	}
	var hlPorts []string
	for _, sp := range hl.Spec.Ports {
		hlPorts = append(hlPorts, fmt.Sprintf("%s/%d->%s", sp.Name, sp.Port, sp.TargetPort.String()))
	}
	if want := []string{"client/4222->client", "cluster/6222->cluster"}; !slices.Equal(hlPorts, want) {
		t.Fatalf("headless Service ports = %v, want %v", hlPorts, want)
	}
	svc := only[*corev1.Service](t, objs, p.CalloutNamespace, "nats")
	if svc.Spec.ClusterIP != "" || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 4222 {
		t.Fatalf("client Service = %+v, want a ClusterIP Service on 4222", svc.Spec)
	}
	for _, sel := range []map[string]string{hl.Spec.Selector, svc.Spec.Selector} {
		for k, v := range sel {
			if ss.Spec.Template.Labels[k] != v {
				t.Fatalf("Service selector %s=%s does not select the servers", k, v)
			}
		}
	}
	pdb := only[*policyv1.PodDisruptionBudget](t, objs, p.CalloutNamespace, "nats")
	if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) {
		t.Fatalf("nats PDB maxUnavailable = %v, want 1", pdb.Spec.MaxUnavailable)
	}
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok && d.Name == "nats" {
			t.Fatal("a cluster also renders the single server's Deployment")
		}
	}

	// The replica count: given, the default with cluster mode, and 1 keeps
	// the single server.
	p.NATSReplicas = 5
	if got := *only[*appsv1.StatefulSet](t, rendered(t, p), p.CalloutNamespace, "nats").Spec.Replicas; got != 5 {
		t.Fatalf("replicas = %d, want 5", got)
	}
	if env := clusterPodEnv(t, p, "pw"); strings.Count(env[natsRouteURLsEnv], "tls://compass-route:pw@nats-") != 5 || !strings.Contains(env[natsRouteURLsEnv], "@nats-4.nats-headless.compass-auth.svc:6222") {
		t.Fatalf("five servers' route URLs = %s", env[natsRouteURLsEnv])
	}
	p.NATSReplicas = 1
	single := rendered(t, p)
	only[*appsv1.Deployment](t, single, p.CalloutNamespace, "nats")
	for _, o := range single {
		if _, ok := o.(*appsv1.StatefulSet); ok {
			t.Fatal("1 replica renders a StatefulSet")
		}
	}
	if conf := string(mustNATSConfig(t, p)); strings.Contains(conf, "cluster {") || strings.Contains(conf, "server_name") {
		t.Fatal("the single server's configuration has a cluster block")
	}
}

// The rendered cluster configuration, as pod nats-0 loads it: the routes
// name every peer by its stable DNS name with the route user and the
// Secret's password, routes are mutual TLS, the route user and password are
// required, and every server has the same auth_callout block and accounts.
func TestNATSConfig_ClusterLoadsAsEveryPod(t *testing.T) {
	issuer := publicKey(t, nkeys.CreateAccount)
	xkey := publicKey(t, nkeys.CreateCurveKeys)
	p := clusterParams(t, issuer, xkey)
	conf, _ := withTestCerts(t, mustNATSConfig(t, p), true)
	setUserPasswords(t)
	setRouteEnv(t, p, testRoutePassword)
	opts := processConfig(t, conf)

	if opts.ServerName != "nats-0" || opts.Cluster.Name != "nats" || opts.Cluster.Port != 6222 || opts.Cluster.NoAdvertise {
		t.Fatalf("server %q, cluster %q port %d no_advertise %v", opts.ServerName, opts.Cluster.Name, opts.Cluster.Port, opts.Cluster.NoAdvertise)
	}
	if opts.Cluster.Username != NATSRouteUser || opts.Cluster.Password != testRoutePassword {
		t.Fatalf("route authorization user %q (password from the Secret: %v)", opts.Cluster.Username, opts.Cluster.Password == testRoutePassword)
	}
	tc := opts.Cluster.TLSConfig
	if tc == nil || tc.ClientAuth != tls.RequireAndVerifyClientCert || tc.ClientCAs == nil || opts.Cluster.TLSTimeout != 3 {
		t.Fatalf("route TLS = %+v, want mutual TLS verified against ca.crt", tc)
	}
	var routes []string
	for _, r := range opts.Routes {
		pw, _ := r.User.Password()
		if r.Scheme != "tls" || r.User.Username() != NATSRouteUser || pw != testRoutePassword {
			t.Fatalf("route %s: scheme %s user %s (the Secret's password: %v)", r.Host, r.Scheme, r.User.Username(), pw == testRoutePassword)
		}
		routes = append(routes, r.Host)
	}
	want := []string{"nats-0.nats-headless.compass-system.svc:6222", "nats-1.nats-headless.compass-system.svc:6222", "nats-2.nats-headless.compass-system.svc:6222"}
	if !slices.Equal(routes, want) {
		t.Fatalf("routes = %v, want %v", routes, want)
	}
	ac := opts.AuthCallout
	if ac == nil || ac.Issuer != issuer || ac.XKey != xkey || ac.Account != "AUTH" || opts.SystemAccount != "SYS" {
		t.Fatalf("auth_callout %+v, system account %q", ac, opts.SystemAccount)
	}
}

// startClusterServer starts one server of the rendered cluster configuration
// on loopback ports, routed to the servers given (the routes' gossip
// connects the rest), keeping the configuration's route TLS and
// authorization; the route URLs carry routePassword.
func startClusterServer(t *testing.T, conf []byte, name, routePassword string, peers ...*server.Server) *server.Server {
	t.Helper()
	opts := processConfig(t, conf)
	opts.ServerName = name
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
	opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", server.RANDOM_PORT
	opts.Routes = nil
	for _, peer := range peers {
		opts.Routes = append(opts.Routes, &url.URL{Scheme: "tls", User: url.UserPassword(NATSRouteUser, routePassword), Host: peer.ClusterAddr().String()})
	}
	opts.NoLog, opts.NoSigs = true, true
	return natsembed.ServeOptions(t, opts)
}

// connectRunner connects to url over TLS as a Runner on node
// ip-10-0-1-5.ec2.internal does, with is's token and no reconnect. It
// returns the connection (closed when the test ends), its client ID and a
// channel closed once the connection ends.
func connectRunner(t *testing.T, is *kubeissuer.Issuer, url string, pool *x509.CertPool) (*nats.Conn, uint64, <-chan struct{}) {
	t.Helper()
	closed := make(chan struct{})
	rc, err := nats.Connect(url, nats.Token(testkeys.Token(t, is, "ip-10-0-1-5.ec2.internal")), tlsTo(pool), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("runner at %s: %v", url, err)
	}
	t.Cleanup(rc.Close)
	cid, err := rc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	return rc, cid, closed
}

// startRenderedCallout starts a test issuer, registered as cluster prod, and
// a callout in server-config mode for the rendered account, connected over
// TLS to url as the rendered compass-callout user; both stop when the test
// ends. It returns the issuer, for the Runners' tokens.
func startRenderedCallout(t *testing.T, p Params, url, password string, pool *x509.CertPool, signer *callout.Signer, xk *callout.XKey) *kubeissuer.Issuer {
	t.Helper()
	is := verifiertest.Issuer(t, kubeissuer.Options{})
	r, err := callout.New(callout.Config{Mode: callout.ModeServerConfig, ResponseSigner: signer, Account: p.NATSAccount, XKey: xk,
		Resolver: verifiertest.Resolver(t, is, "prod", "")})
	if err != nil {
		t.Fatal(err)
	}
	cnc, err := nats.Connect(url, nats.UserInfo("compass-callout", password), tlsTo(pool), nats.NoReconnect())
	if err != nil {
		t.Fatalf("callout user at %s: %v", url, err)
	}
	natsembed.StartResponder(t, r, cnc)
	return is
}

// A Runner connecting to one server of the rendered cluster is authorized
// by a callout connected to another: the request crosses the routes in the
// AUTH account, the answer comes back, and the Runner lands in RUNNERS as
// its Runner ID. A bad token is refused there too. And the kick identity,
// connected to the callout's server, lists the Runner's connection on its
// server (every server answers the listing, across the routes) and ends it
// there, with nothing refused.
func TestNATSConfig_ClusterAuthCalloutAcrossRoutes(t *testing.T) {
	signer, xk := natsembed.Keys(t)
	p := clusterParams(t, signer.Public(), xk.Public())
	conf, pool := withTestCerts(t, mustNATSConfig(t, p), true)
	setUserPasswords(t)
	setRouteEnv(t, p, testRoutePassword)

	s0 := startClusterServer(t, conf, "nats-0", testRoutePassword)
	s1 := startClusterServer(t, conf, "nats-1", testRoutePassword, s0)
	s2 := startClusterServer(t, conf, "nats-2", testRoutePassword, s0, s1)
	for _, s := range []*server.Server{s0, s1, s2} {
		testutil.Eventually(t, gossipWait, s.Name()+" routed to both others", func() bool { return s.NumRemotes() == 2 })
	}

	is := startRenderedCallout(t, p, s0.ClientURL(), calloutTestPassword, pool, signer, xk)
	auth, err := s2.LookupAccount("AUTH")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, gossipWait, "the callout's subscription on nats-0 known to nats-2", func() bool { return auth.SubscriptionInterest("$SYS.REQ.USER.AUTH") })

	rc, cid, closed := connectRunner(t, is, s2.ClientURL(), pool) // the callout is on nats-0
	cz, err := s2.Connz(&server.ConnzOptions{CID: cid, Username: true})
	if err != nil || len(cz.Conns) != 1 {
		t.Fatalf("connz on nats-2: %v", err)
	}
	if got := cz.Conns[0]; got.AuthorizedUser != "prod/ip-10-0-1-5_ec2_internal" || got.Account != p.NATSAccount {
		t.Fatalf("the Runner is user %q in %q, want prod/ip-10-0-1-5_ec2_internal in %s", got.AuthorizedUser, got.Account, p.NATSAccount)
	}
	// The Runner learns the other two servers from INFO, to reconnect to.
	testutil.Eventually(t, gossipWait, "the Runner to learn the other servers", func() bool { return len(rc.DiscoveredServers()) == 2 })
	if _, err := nats.Connect(s1.ClientURL(), nats.Token("not-a-token"), tlsTo(pool), nats.NoReconnect()); !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("a bad token on nats-1: err = %v, want %v", err, nats.ErrAuthorization)
	}

	kc, violations := kickConn(t, s0.ClientURL(), tlsTo(pool))
	var on2 *sysAnswer
	for _, a := range sysRequest(t, kc, kick.SubjectConnzAll, connzRequest(p.NATSAccount), 3) {
		if a.Server.ID == s2.ID() {
			on2 = &a
		}
	}
	if on2 == nil || !on2.hasConn(cid, "prod/ip-10-0-1-5_ec2_internal") {
		t.Fatalf("the listing from nats-0 does not show the Runner on nats-2: %+v", on2)
	}
	sysRequest(t, kc, "$SYS.REQ.SERVER."+s2.ID()+".KICK", map[string]uint64{"cid": cid}, 1)
	select {
	case <-closed:
	case <-time.After(kickWait):
		t.Fatal("the Runner's connection on nats-2 is still open after the kick from nats-0 was answered")
	}
	noViolation(t, kc, violations)
}

// A route needs both the certificate and the route password: a peer with the
// certificate and a wrong password gets an authorization violation, one
// without a certificate does not get past the TLS handshake.
func TestNATSConfig_ClusterRoutesNeedCertificateAndPassword(t *testing.T) {
	p := clusterParams(t, publicKey(t, nkeys.CreateAccount), publicKey(t, nkeys.CreateCurveKeys))
	conf, pool, dir := withTestCertsDir(t, mustNATSConfig(t, p), true)
	setUserPasswords(t)
	setRouteEnv(t, p, testRoutePassword)
	s := startClusterServer(t, conf, "nats-0", testRoutePassword)
	addr := s.ClusterAddr().String()

	// The peer presents the servers' own certificate (and key), which the
	// routes' ca.crt trusts.
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	routeConnect := func(certs []tls.Certificate, password string) (string, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			return "", err
		}
		// A route port starts with the TLS handshake, then sends INFO.
		tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: certs, MinVersion: tls.VersionTLS12})
		if err := tc.Handshake(); err != nil {
			return "", err
		}
		br := bufio.NewReader(tc)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
			return "", fmt.Errorf("no INFO: %q %v", line, err)
		}
		connect := fmt.Sprintf(`CONNECT {"user":%q,"pass":%q,"tls_required":true,"name":"NPEER","cluster":"nats","verbose":false,"pedantic":false}`+"\r\nPING\r\n", NATSRouteUser, password)
		if _, err := tc.Write([]byte(connect)); err != nil {
			return "", err
		}
		line, err := br.ReadString('\n')
		return strings.TrimSpace(line), err
	}
	if line, err := routeConnect([]tls.Certificate{cert}, "wrong-password"); err != nil || line != "-ERR 'Authorization Violation'" {
		t.Fatalf("a route with a wrong password: %q, %v; want -ERR 'Authorization Violation'", line, err)
	}
	if line, err := routeConnect(nil, testRoutePassword); err == nil {
		t.Fatalf("a route without a certificate got %q", line)
	}
}
