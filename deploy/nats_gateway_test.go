package deploy

// The gateway as rendered (issue 35 item 3, DL-466): the objects, the
// configuration as nats-server's own parser and the real binary read it,
// and two regions' rendered clusters joined by it.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy/chart"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/test/natsembed"
)

// testGatewayPassword is what the tests put in Secret compass-nats-gateway,
// hex as docs/helm.md has it generated.
const testGatewayPassword = "7d0c4e1f9a2b8c3d6e5f0a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d"

// regionParams is region name of a supercluster: the in-cluster NATS as a
// cluster of servers, with real public keys, its gateway to the remotes.
func regionParams(t *testing.T, issuer, xkey, name string, servers int, remotes ...NATSGatewayRemote) Params {
	t.Helper()
	p := clusterParams(t, issuer, xkey)
	p.NATSImage, p.NATSReplicas = NATSImage, servers
	p.NATSGateway, p.NATSGatewayName, p.NATSGatewayRemotes = true, name, remotes
	return p
}

// gatewayPodEnv is pod's environment in p's StatefulSet, resolved as the
// kubelet resolves it with the test's Secrets.
func gatewayPodEnv(t *testing.T, p Params, pod string) map[string]string {
	t.Helper()
	secrets := secretsWithRoute(testRoutePassword)
	secrets[NATSGatewaySecret+"/password"] = testGatewayPassword
	return kubeletEnv(t, natsContainer(t, p), secrets, map[string]string{"metadata.name": pod})
}

func setEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// withGatewayCert rewrites where conf reads the gateway certificate (the
// Secret's mount point, 3 files) to gwDir, and the client and route
// certificates as withTestCertsDir does. It returns the configuration, a
// pool trusting the client certificate and the directory of the client and
// route certificate.
func withGatewayCert(t *testing.T, conf []byte, gwDir string) ([]byte, *x509.CertPool, string) {
	t.Helper()
	s := string(conf)
	if got := strings.Count(s, `"`+natsGatewayTLSDir+"/"); got != 3 {
		t.Fatalf("the configuration reads %d files under %s, want 3", got, natsGatewayTLSDir)
	}
	return withTestCertsDir(t, []byte(strings.ReplaceAll(s, `"`+natsGatewayTLSDir+"/", `"`+gwDir+"/")), true)
}

// freePort is a loopback TCP port nothing listens on, for a listener whose
// address a configuration must name before it starts.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startRegionServer starts the rendered configuration conf as the pod whose
// environment is env, on loopback: clients, routes (to the peers given) and
// the gateway (on gwPort, server.RANDOM_PORT for any) on ports of their
// own, every remote gateway dialled at remoteAddr (the other region's
// load balancer, in a cluster), the gateway's TLS, authorization and
// reject_unknown_cluster as rendered. The routes carry the test's route
// password.
func startRegionServer(t *testing.T, conf []byte, env map[string]string, gwPort int, remoteAddr string, peers ...*server.Server) *server.Server {
	t.Helper()
	setEnv(t, env)
	opts := processConfig(t, conf)
	if opts.ServerName != env[natsServerNameEnv] {
		t.Fatalf("server_name %q, the pod's %s is %q", opts.ServerName, natsServerNameEnv, env[natsServerNameEnv])
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
	opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", server.RANDOM_PORT
	opts.Routes = nil
	for _, peer := range peers {
		opts.Routes = append(opts.Routes, &url.URL{Scheme: "tls", User: url.UserPassword(NATSRouteUser, testRoutePassword), Host: peer.ClusterAddr().String()})
	}
	opts.Gateway.Host, opts.Gateway.Port, opts.Gateway.Advertise = "127.0.0.1", gwPort, ""
	for _, g := range opts.Gateway.Gateways {
		g.URLs = []*url.URL{{Scheme: "tls", Host: remoteAddr}}
	}
	opts.NoLog, opts.NoSigs = true, true
	return natsembed.ServeOptions(t, opts)
}

// The gateway's objects: the servers' gateway port, their name per region,
// the gateway password by reference, the certificate mounted as a
// directory; the port on the headless Service and on a Service of its own,
// never on the clients'; and the NetworkPolicy's rules both ways.
func TestRender_NATSGatewayObjects(t *testing.T) {
	p := gatewayBase()
	p.CalloutNamespace, p.NATSGatewayPort, p.NATSGatewayTLSSecret = "compass-auth", 7443, "us-east-gateway"
	p.NATSGatewayRemotes = []NATSGatewayRemote{
		gatewayRemote("eu-west", "tls://nats-gateway.eu-west.example.com:7443"),
		gatewayRemote("ap-south", "tls://203.0.113.9:443", "tls://203.0.113.10:443"),
	}
	objs := rendered(t, p)
	ss := only[*appsv1.StatefulSet](t, objs, p.CalloutNamespace, "nats")
	spec := ss.Spec.Template.Spec
	checkSecretMount(t, spec, "gateway-tls", natsGatewayTLSDir, p.NATSGatewayTLSSecret)
	c := spec.Containers[0]
	var ports []string
	for _, cp := range c.Ports {
		ports = append(ports, fmt.Sprintf("%s/%d", cp.Name, cp.ContainerPort))
	}
	if want := []string{"client/4222", "cluster/6222", "gateway/7443"}; !slices.Equal(ports, want) {
		t.Fatalf("ports = %v, want %v", ports, want)
	}
	var order []string
	byName := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		order = append(order, e.Name)
		byName[e.Name] = e
	}
	if want := []string{"COMPASS_CALLOUT_NATS_PASSWORD", "COMPASS_SERVER_NATS_PASSWORD", "COMPASS_KICK_NATS_PASSWORD",
		natsPodNameEnv, natsServerNameEnv, natsRoutePasswordEnv, natsRouteURLsEnv, natsGatewayPasswordEnv}; !slices.Equal(order, want) {
		t.Fatalf("env order = %v, want %v", order, want)
	}
	if r := byName[natsGatewayPasswordEnv].ValueFrom; r == nil || r.SecretKeyRef == nil || r.SecretKeyRef.Name != NATSGatewaySecret || r.SecretKeyRef.Key != "password" ||
		(r.SecretKeyRef.Optional != nil && *r.SecretKeyRef.Optional) {
		t.Fatalf("%s = %+v, want Secret %s key password, required", natsGatewayPasswordEnv, r, NATSGatewaySecret)
	}
	env := gatewayPodEnv(t, p, "nats-1")
	if env[natsServerNameEnv] != "nats-1.us-east" || env[natsGatewayPasswordEnv] != testGatewayPassword {
		t.Fatalf("pod nats-1: server name %q (the gateway password from the Secret: %v)", env[natsServerNameEnv], env[natsGatewayPasswordEnv] == testGatewayPassword)
	}

	servicePorts := func(svc *corev1.Service) []string {
		var out []string
		for _, sp := range svc.Spec.Ports {
			out = append(out, fmt.Sprintf("%s/%d->%s", sp.Name, sp.Port, sp.TargetPort.String()))
		}
		return out
	}
	hl := only[*corev1.Service](t, objs, p.CalloutNamespace, natsHeadlessService)
	if got, want := servicePorts(hl), []string{"client/4222->client", "cluster/6222->cluster", "gateway/7443->gateway"}; !slices.Equal(got, want) {
		t.Fatalf("headless Service ports = %v, want %v", got, want)
	}
	if got := servicePorts(only[*corev1.Service](t, objs, p.CalloutNamespace, "nats")); !slices.Equal(got, []string{"client/4222->client"}) {
		t.Fatalf("the clients' Service ports = %v, want the client port alone", got)
	}
	gw := only[*corev1.Service](t, objs, p.CalloutNamespace, natsGatewayService)
	if got := servicePorts(gw); !slices.Equal(got, []string{"gateway/7443->gateway"}) || gw.Spec.Type != corev1.ServiceTypeClusterIP || gw.Spec.ExternalTrafficPolicy != "" {
		t.Fatalf("Service %s: ports %v, type %q, externalTrafficPolicy %q; want the gateway port alone, ClusterIP by default", natsGatewayService, got, gw.Spec.Type, gw.Spec.ExternalTrafficPolicy)
	}
	for k, v := range gw.Spec.Selector {
		if ss.Spec.Template.Labels[k] != v {
			t.Fatalf("Service %s selector %s=%s does not select the servers", natsGatewayService, k, v)
		}
	}
	// A load balancer keeps the other regions' addresses, and takes its annotations.
	out, err := RenderValues(p, map[string]any{"nats": map[string]any{"gateway": map[string]any{
		"serviceType": "LoadBalancer", "serviceAnnotations": map[string]any{"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	lbObjs, err := decodeStrict(out)
	if err != nil {
		t.Fatal(err)
	}
	lb := only[*corev1.Service](t, lbObjs, p.CalloutNamespace, natsGatewayService)
	if lb.Spec.Type != corev1.ServiceTypeLoadBalancer || lb.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		lb.Annotations["service.beta.kubernetes.io/aws-load-balancer-type"] != "nlb" {
		t.Fatalf("Service %s as a load balancer: type %q, externalTrafficPolicy %q, annotations %v", natsGatewayService, lb.Spec.Type, lb.Spec.ExternalTrafficPolicy, lb.Annotations)
	}

	// A change nats-server cannot reload (the remotes, the name, the port,
	// the advertised address) rolls the servers; a change of the
	// NetworkPolicy's networks does not.
	gatewayAnnotation := func(p Params) string {
		t.Helper()
		return only[*appsv1.StatefulSet](t, rendered(t, p), p.CalloutNamespace, "nats").Spec.Template.Annotations["compass-runner.io/nats-gateway"]
	}
	hash := gatewayAnnotation(p)
	if len(hash) != 64 {
		t.Fatalf("the servers' pods carry gateway annotation %q, want a SHA-256", hash)
	}
	for name, change := range map[string]func(*Params){
		"a region added": func(q *Params) {
			q.NATSGatewayRemotes = append(slices.Clone(q.NATSGatewayRemotes), gatewayRemote("sa-east", "tls://sa.example.com:7443"))
		},
		"a URL changed": func(q *Params) {
			q.NATSGatewayRemotes = []NATSGatewayRemote{q.NATSGatewayRemotes[0], gatewayRemote("ap-south", "tls://203.0.113.9:443")}
		},
		"the port":            func(q *Params) { q.NATSGatewayPort = 7444 },
		"the advertised name": func(q *Params) { q.NATSGatewayAdvertise = "gw.us-east.example.com:7443" },
	} {
		q := p
		change(&q)
		if gatewayAnnotation(q) == hash {
			t.Errorf("%s: the servers' pods are unchanged, so nats-server keeps its old gateway", name)
		}
	}
	q := p
	q.GatewayCIDRs = []string{"203.0.113.0/24"}
	if gatewayAnnotation(q) != hash {
		t.Error("a change of the gateway CIDRs rolls the servers")
	}
	q = DefaultParams()
	q.NATSImage, q.NATSCluster = NATSImage, true
	if _, ok := only[*appsv1.StatefulSet](t, rendered(t, q), q.CalloutNamespace, "nats").Spec.Template.Annotations["compass-runner.io/nats-gateway"]; ok {
		t.Error("the servers of a cluster without a gateway carry the gateway annotation")
	}

	// The NetworkPolicy: gateways in on the gateway port and out on the
	// remotes' ports and the gateway port, from and to any address by
	// default, only the other regions' networks when given; no other port
	// opens to them.
	internet, region, elsewhere := external("198.51.100.7"), external("203.0.113.9"), external("192.0.2.1")
	checkFlows(t, objs, p.CalloutNamespace, []flow{
		{"a gateway from anywhere", "nats", true, internet, 7443, tcp, true},
		{"the client port from outside", "nats", true, internet, 4222, tcp, false},
		{"the route port from outside", "nats", true, internet, 6222, tcp, false},
		{"the gateway port from a pod elsewhere", "nats", true, podPeer("default", "attacker"), 7443, tcp, true},
		{"a remote's URL port", "nats", false, region, 443, tcp, true},
		{"the gateway port out", "nats", false, internet, 7443, tcp, true},
		{"another port out", "nats", false, internet, 4222, tcp, false},
	})
	p.GatewayCIDRs = []string{"203.0.113.0/24", "2001:db8::/32"}
	checkFlows(t, rendered(t, p), p.CalloutNamespace, []flow{
		{"a gateway from the regions' networks", "nats", true, region, 7443, tcp, true},
		{"a gateway from the regions' IPv6 network", "nats", true, external("2001:db8::9"), 7443, tcp, true},
		{"a gateway from elsewhere", "nats", true, elsewhere, 7443, tcp, false},
		{"a gateway from a pod elsewhere", "nats", true, podPeer("default", "attacker"), 7443, tcp, false},
		{"a remote's URL port in the regions' networks", "nats", false, region, 443, tcp, true},
		{"a remote's URL port elsewhere", "nats", false, elsewhere, 443, tcp, false},
		{"the gateway port elsewhere", "nats", false, elsewhere, 7443, tcp, false},
	})
}

// The rendered configuration as pod nats-2 of region us-east loads it with
// nats-server's own parser: the gateway named as the region, listening on
// every address, advertising the address given, accepting only the listed
// regions, over mutual TLS verified against the gateway's ca.crt, with the
// gateway user and the Secret's password; the cluster named as the gateway;
// the server as <pod>.<gateway>. nats-server's own validation (NewServer)
// accepts it, and would refuse the cluster's name without a gateway, "nats":
// the two must be one.
func TestNATSConfig_GatewayLoadsAsEveryPod(t *testing.T) {
	p := regionParams(t, publicKey(t, nkeys.CreateAccount), publicKey(t, nkeys.CreateCurveKeys), "us-east", 3,
		gatewayRemote("eu-west", "tls://nats-gateway.eu-west.example.com:7222", "tls://203.0.113.9:7222"),
		gatewayRemote("ap-south", "nats://[2001:db8::9]:443"))
	p.NATSGatewayAdvertise = "nats-gateway.us-east.example.com:7222"
	gwDir := t.TempDir()
	writeTestCert(t, gwDir)
	conf, _, _ := withGatewayCert(t, mustNATSConfig(t, p), gwDir)
	if strings.Contains(string(conf), testGatewayPassword) {
		t.Fatal("the gateway password is in the configuration")
	}
	setUserPasswords(t)
	setEnv(t, gatewayPodEnv(t, p, "nats-2"))
	opts := processConfig(t, conf)

	if opts.ServerName != "nats-2.us-east" || opts.Cluster.Name != "us-east" {
		t.Fatalf("server %q in cluster %q, want nats-2.us-east in us-east", opts.ServerName, opts.Cluster.Name)
	}
	g := opts.Gateway
	if g.Name != "us-east" || g.Host != "0.0.0.0" || g.Port != 7222 || g.Advertise != p.NATSGatewayAdvertise || !g.RejectUnknown {
		t.Fatalf("gateway %q on %s:%d advertising %q, reject_unknown_cluster %v", g.Name, g.Host, g.Port, g.Advertise, g.RejectUnknown)
	}
	if g.Username != NATSGatewayUser || g.Password != testGatewayPassword || g.AuthTimeout != 3 {
		t.Fatalf("gateway authorization: user %q (the Secret's password: %v), timeout %v", g.Username, g.Password == testGatewayPassword, g.AuthTimeout)
	}
	if tc := g.TLSConfig; tc == nil || tc.ClientAuth != tls.RequireAndVerifyClientCert || tc.ClientCAs == nil || len(tc.Certificates) != 1 || g.TLSTimeout != 3 {
		t.Fatalf("gateway TLS = %+v, want mutual TLS verified against ca.crt", tc)
	}
	var remotes []string
	for _, r := range g.Gateways {
		var urls []string
		for _, u := range r.URLs {
			if u.User != nil {
				t.Fatalf("remote %s: a URL carries credentials", r.Name)
			}
			urls = append(urls, u.Scheme+"://"+u.Host)
		}
		if r.TLSConfig != nil {
			t.Fatalf("remote %s has TLS of its own: every remote is dialled with the gateway's", r.Name)
		}
		remotes = append(remotes, r.Name+"="+strings.Join(urls, ","))
	}
	if want := []string{"eu-west=tls://nats-gateway.eu-west.example.com:7222,tls://203.0.113.9:7222", "ap-south=nats://[2001:db8::9]:443"}; !slices.Equal(remotes, want) {
		t.Fatalf("remotes = %v, want %v", remotes, want)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered gateway: %v", err)
	}
	s.Shutdown()
	other := processConfig(t, conf)
	other.Cluster.Name = "nats"
	if _, err := server.NewServer(other); err != server.ErrClusterNameConfigConflict {
		t.Fatalf("the cluster named nats beside gateway us-east: %v, want %v", err, server.ErrClusterNameConfigConflict)
	}
}

// The real nats-server binary accepts the rendered gateway configuration
// with the Secrets' values in its environment, and refuses it without the
// gateway password.
func TestNATSBinary_AcceptsRenderedGatewayConfig(t *testing.T) {
	p := regionParams(t, publicKey(t, nkeys.CreateAccount), publicKey(t, nkeys.CreateCurveKeys), "eu-west", 0,
		gatewayRemote("us-east", "tls://nats-gateway.us-east.example.com:7222"))
	gwDir := t.TempDir()
	writeTestCert(t, gwDir)
	conf, _, _ := withGatewayCert(t, mustNATSConfig(t, p), gwDir)
	env := gatewayPodEnv(t, p, "nats-0")
	if out, ok := checkConfig(t, conf, env); !ok {
		t.Fatalf("nats-server -t refuses the gateway configuration:\n%s", out)
	}
	delete(env, natsGatewayPasswordEnv)
	if out, ok := checkConfig(t, conf, env); ok || !strings.Contains(out, "variable reference for '"+natsGatewayPasswordEnv+"'") {
		t.Fatalf("nats-server -t without %s: accepted %v\n%s", natsGatewayPasswordEnv, ok, out)
	}
}

// A gateway connection needs the gateway CA's certificate, the gateway
// password and a region the gateway lists: one without a certificate, or
// with another CA's, does not get past TLS; one with a wrong password gets
// an authorization violation; a region not listed is refused by name.
func TestNATSConfig_GatewayNeedsCertificatePasswordAndListing(t *testing.T) {
	p := regionParams(t, publicKey(t, nkeys.CreateAccount), publicKey(t, nkeys.CreateCurveKeys), "us-east", 0,
		gatewayRemote("eu-west", "tls://nats-gateway.eu-west.example.com:7222"))
	gwDir := t.TempDir()
	gwPool := writeTestCert(t, gwDir)
	conf, _, routeDir := withGatewayCert(t, mustNATSConfig(t, p), gwDir)
	setUserPasswords(t)
	s := startRegionServer(t, conf, gatewayPodEnv(t, p, "nats-0"), server.RANDOM_PORT, "127.0.0.1:1")
	addr := s.GatewayAddr().String()

	load := func(dir string) []tls.Certificate {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{cert}
	}
	gatewayConnect := func(certs []tls.Certificate, gateway, password string) (string, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			return "", err
		}
		tc := tls.Client(c, &tls.Config{RootCAs: gwPool, ServerName: "localhost", Certificates: certs, MinVersion: tls.VersionTLS12})
		if err := tc.Handshake(); err != nil {
			return "", err
		}
		br := bufio.NewReader(tc)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
			return "", fmt.Errorf("no INFO: %q %v", line, err)
		}
		connect := fmt.Sprintf(`CONNECT {"user":%q,"pass":%q,"tls_required":true,"name":"NPEER","gateway":%q,"verbose":false,"pedantic":false}`+"\r\nPING\r\n",
			NATSGatewayUser, password, gateway)
		if _, err := tc.Write([]byte(connect)); err != nil {
			return "", err
		}
		for {
			line, err := br.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "INFO ") {
				return strings.TrimSpace(line), err
			}
		}
	}
	for _, tc := range []struct {
		name              string
		certs             []tls.Certificate
		gateway, password string
		want              string // the server's answer to CONNECT and PING; "": no answer, TLS fails
	}{
		{"the listed region", load(gwDir), "eu-west", testGatewayPassword, "PONG"},
		{"a wrong password", load(gwDir), "eu-west", "wrong-password", "-ERR 'Authorization Violation'"},
		{"a region not listed", load(gwDir), "sa-east", testGatewayPassword, `-ERR 'Connection to gateway "us-east" rejected'`},
		{"no certificate", nil, "eu-west", testGatewayPassword, ""},
		{"another CA's certificate", load(routeDir), "eu-west", testGatewayPassword, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, err := gatewayConnect(tc.certs, tc.gateway, tc.password)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("got past TLS: %q", line)
				}
				return
			}
			if err != nil || line != tc.want {
				t.Fatalf("got %q, %v; want %q", line, err, tc.want)
			}
		})
	}
}

// Two regions, each the rendered configuration of a cluster of two servers
// with ports rewritten to loopback, join through their gateways: every
// server has its outbound gateway to the other region, whose servers take
// them, and every server's name is unique in the supercluster.
// The system account spans it: the kick identity's listing (the callout's
// $SYS.REQ.SERVER.PING.CONNZ) asked in us-east is answered by all four
// servers, so each region's callout sees, and judges, the other region's
// Runners too; and with the same callout keys in both regions a Runner in
// a region without a callout is authorized by the other's.
func TestNATSConfig_GatewaysJoinTwoRegions(t *testing.T) {
	signer, xk := natsembed.Keys(t) // the callout's keys, the same in both regions
	issuer, xkey := signer.Public(), xk.Public()
	east := regionParams(t, issuer, xkey, "us-east", 2, gatewayRemote("eu-west", "tls://nats-gateway.eu-west.example.com:7222"))
	west := regionParams(t, issuer, xkey, "eu-west", 2, gatewayRemote("us-east", "tls://nats-gateway.us-east.example.com:7222"))
	gwDir := t.TempDir() // one gateway CA for the supercluster
	writeTestCert(t, gwDir)
	eastConf, eastPool, _ := withGatewayCert(t, mustNATSConfig(t, east), gwDir)
	westConf, westPool, _ := withGatewayCert(t, mustNATSConfig(t, west), gwDir)
	setUserPasswords(t)

	// The first server of each region stands in for its load balancer.
	eastPort, westPort := freePort(t), freePort(t)
	eastAddr, westAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(eastPort)), net.JoinHostPort("127.0.0.1", strconv.Itoa(westPort))
	e0 := startRegionServer(t, eastConf, gatewayPodEnv(t, east, "nats-0"), eastPort, westAddr)
	e1 := startRegionServer(t, eastConf, gatewayPodEnv(t, east, "nats-1"), server.RANDOM_PORT, westAddr, e0)
	w0 := startRegionServer(t, westConf, gatewayPodEnv(t, west, "nats-0"), westPort, eastAddr)
	w1 := startRegionServer(t, westConf, gatewayPodEnv(t, west, "nats-1"), server.RANDOM_PORT, eastAddr, w0)

	regions := []struct {
		name, other string
		servers     []*server.Server
	}{{"us-east", "eu-west", []*server.Server{e0, e1}}, {"eu-west", "us-east", []*server.Server{w0, w1}}}
	for _, r := range regions {
		// Every server dials one server of the other region; each of those
		// takes it, so the region's inbound gateways are the other's servers.
		testutil.Eventually(t, gossipWait, r.name+" joined to "+r.other, func() bool {
			in := 0
			for _, s := range r.servers {
				gz, err := s.Gatewayz(nil)
				if err != nil || gz.Name != r.name || s.NumRemotes() != 1 {
					return false
				}
				if out := gz.OutboundGateways[r.other]; out == nil || out.Connection == nil {
					return false
				}
				in += len(gz.InboundGateways[r.other])
			}
			return in == 2
		})
	}

	// A callout in us-east only: a Runner connecting in eu-west is
	// authorized by it across the gateway (the callouts' queue group,
	// served in another region when its own has no member).
	is := startRenderedCallout(t, east, e0.ClientURL(), calloutTestPassword, eastPool, signer, xk)
	var rc *nats.Conn
	testutil.Eventually(t, gossipWait, "a Runner on eu-west authorized by the callout in us-east", func() bool {
		c, err := nats.Connect(w0.ClientURL(), nats.Token(testkeys.Token(t, is, "ip-10-0-1-5.ec2.internal")), tlsTo(westPool), nats.NoReconnect())
		rc = c
		return err == nil
	})
	t.Cleanup(rc.Close)
	cid, err := rc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}

	// The kick identity's listing asked in us-east is answered by all four
	// servers, eu-west's showing the Runner connected there.
	kc, violations := kickConn(t, e0.ClientURL(), tlsTo(eastPool))
	var names []string
	var onW0 *sysAnswer
	for _, a := range sysRequest(t, kc, kick.SubjectConnzAll, connzRequest(east.NATSAccount), 4) {
		names = append(names, a.Server.Name)
		if a.Server.ID == w0.ID() {
			onW0 = &a
		}
	}
	slices.Sort(names)
	if want := []string{"nats-0.eu-west", "nats-0.us-east", "nats-1.eu-west", "nats-1.us-east"}; !slices.Equal(names, want) {
		t.Fatalf("the listing from us-east was answered by %v, want %v", names, want)
	}
	if onW0 == nil || !onW0.hasConn(cid, "prod/ip-10-0-1-5_ec2_internal") {
		t.Fatalf("the listing from us-east does not show the Runner on nats-0.eu-west: %+v", onW0)
	}
	noViolation(t, kc, violations)
}

// The gateway's flags reach the Params (--nats-gateway-remote repeated, in
// order), and a remote without its = is refused as the flag is parsed.
func TestManifestsCommand_NATSGatewayFlags(t *testing.T) {
	args := []string{
		"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443",
		"--nats-image", NATSImage, "--nats-cluster",
		"--nats-gateway", "--nats-gateway-name", "us-east", "--nats-gateway-port", "7443",
		"--nats-gateway-tls-secret", "gateway-cert", "--nats-gateway-advertise", "gw.us-east.example.com:7443",
		"--nats-gateway-remote", "eu-west=tls://gw.eu-west.example.com:7443,tls://203.0.113.9:7443",
		"--nats-gateway-remote", "ap-south=tls://gw.ap-south.example.com:7443",
		"--nats-gateway-cidr", "203.0.113.0/24", "--nats-gateway-cidr", "198.51.100.0/24",
	}
	p := DefaultParams()
	p.NATSImage, p.NATSCluster = NATSImage, true
	p.NATSGateway, p.NATSGatewayName, p.NATSGatewayPort = true, "us-east", 7443
	p.NATSGatewayTLSSecret, p.NATSGatewayAdvertise = "gateway-cert", "gw.us-east.example.com:7443"
	p.NATSGatewayRemotes = []NATSGatewayRemote{
		gatewayRemote("eu-west", "tls://gw.eu-west.example.com:7443", "tls://203.0.113.9:7443"),
		gatewayRemote("ap-south", "tls://gw.ap-south.example.com:7443"),
	}
	p.GatewayCIDRs = []string{"203.0.113.0/24", "198.51.100.0/24"}
	var stdout, stderr bytes.Buffer
	if err := ManifestsCommand(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("ManifestsCommand: %v (stderr %q)", err, stderr.String())
	}
	want, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdout.Bytes(), want) {
		t.Fatal("ManifestsCommand differs from rendering the same parameters")
	}
	for _, s := range []string{`{ name: "eu-west", urls: ["tls://gw.eu-west.example.com:7443", "tls://203.0.113.9:7443"] }`, `advertise: "gw.us-east.example.com:7443"`} {
		if !strings.Contains(stdout.String(), s) {
			t.Fatalf("the manifests do not say %s", s)
		}
	}

	stdout.Reset()
	stderr.Reset()
	err = ManifestsCommand(context.Background(), append(slices.Clone(args), "--nats-gateway-remote", "eu-west"), &stdout, &stderr)
	if want := `deploy: manifests: invalid value "eu-west" for flag -nats-gateway-remote: want NAME=URL[,URL...]: the other region's gateway name, then the URLs its gateway is reached at`; err == nil || err.Error() != want {
		t.Fatalf("--nats-gateway-remote eu-west:\n got %v\nwant %s", err, want)
	}
	stdout.Reset()
	err = ManifestsCommand(context.Background(), append(slices.Clone(args), "--nats-gateway-remote", "sa-east="), &stdout, &stderr)
	if want := `deploy: invalid parameters: NATS gateway remotes: entry 2 "sa-east" has no URL`; err == nil || err.Error() != want || stdout.Len() != 0 {
		t.Fatalf("--nats-gateway-remote sa-east=:\n got %v\nwant %s", err, want)
	}

	// The nats chart's values carry no gateway: refused, not left out.
	stdout.Reset()
	err = ManifestsCommand(context.Background(), append(slices.Clone(args), "--nats-helm-values"), &stdout, &stderr)
	if want := "deploy: chart: invalid values: nats.gateway.enabled: the nats chart's values (--nats-helm-values) carry no gateway; give the nats chart's config.gateway the gateway block of ConfigMap compass-nats-config, or install NATS with this chart (nats.enabled)"; err == nil || err.Error() != want || stdout.Len() != 0 {
		t.Fatalf("--nats-helm-values with a gateway:\n got %v\nwant %s", err, want)
	}
}

// docs/helm.md's example values, one file per region, render as they are
// (the callout's keys added): each region's gateway lists the other, by the
// name the other gives itself.
func TestHelmDocSuperclusterValuesRender(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "helm.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n## A supercluster of regions\n")
	if start < 0 {
		t.Fatal("docs/helm.md has no section A supercluster of regions")
	}
	section := doc[start+1:]
	section = section[:strings.Index(section, "\n## ")]
	var files []map[string]any
	for _, block := range strings.Split(section, "```yaml\n")[1:] {
		var vals map[string]any
		if err := yaml.Unmarshal([]byte(block[:strings.Index(block, "```")]), &vals); err != nil {
			t.Fatalf("a values file of the section: %v", err)
		}
		files = append(files, vals)
	}
	if len(files) != 2 {
		t.Fatalf("the section has %d values files, want one per region, two", len(files))
	}
	c, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	issuer, xkey := publicKey(t, nkeys.CreateAccount), publicKey(t, nkeys.CreateCurveKeys)
	names := map[string][]string{} // region: the remotes it lists
	for _, vals := range files {
		vals["callout"] = map[string]any{"issuer": issuer, "xkey": xkey}
		out, err := c.Render(vals, release)
		if err != nil {
			t.Fatalf("a region's values from docs/helm.md: %v", err)
		}
		gw := vals["nats"].(map[string]any)["gateway"].(map[string]any)
		name := gw["name"].(string)
		if !strings.Contains(out["callout.yaml"], fmt.Sprintf("gateway {\n      name: %q", name)) {
			t.Fatalf("region %s: no gateway block in the rendering", name)
		}
		for _, r := range gw["remotes"].([]any) {
			names[name] = append(names[name], r.(map[string]any)["name"].(string))
		}
	}
	for name, remotes := range names {
		for _, other := range remotes {
			if other != "ap-south" && !slices.Contains(names[other], name) { // ap-south: a third region the example does not show
				t.Errorf("region %s lists %s, which does not list it", name, other)
			}
		}
	}
}
