package deploy

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/compass-runner/identity/test/natsembed"
)

// serveRendered loads a rendered configuration with nats-server's own parser
// (processConfig) and runs it in-process on a random port, without the
// monitoring port.
func serveRendered(t *testing.T, conf []byte) (*server.Server, *server.Options) {
	t.Helper()
	opts := processConfig(t, conf)
	opts.Port = server.RANDOM_PORT
	opts.HTTPPort = 0
	opts.NoLog, opts.NoSigs = true, true
	return natsembed.ServeOptions(t, opts), opts
}

// withTestCerts writes a test certificate where conf reads the client and
// route certificates (the Secrets' mount points in the pod, rewritten to a
// temporary directory; the count of each rewrite is checked, so a path the
// test does not know fails it) and returns the rewritten configuration and a
// pool trusting the certificate.
func withTestCerts(t *testing.T, conf []byte, clustered bool) ([]byte, *x509.CertPool) {
	t.Helper()
	conf, pool, _ := withTestCertsDir(t, conf, clustered)
	return conf, pool
}

// withTestCertsDir is withTestCerts, also returning the certificate's directory.
func withTestCertsDir(t *testing.T, conf []byte, clustered bool) ([]byte, *x509.CertPool, string) {
	t.Helper()
	dir := t.TempDir()
	pool := writeTestCert(t, dir)
	s := string(conf)
	routeFiles := 0 // tls.crt, tls.key and ca.crt for a cluster's routes
	if clustered {
		routeFiles = 3
	}
	for _, r := range []struct {
		mount string
		want  int
	}{{natsTLSDir + "/", 2}, {natsRouteTLSDir + "/", routeFiles}} {
		if got := strings.Count(s, `"`+r.mount); got != r.want {
			t.Fatalf("the configuration reads %d files under %s, want %d", got, r.mount, r.want)
		}
		s = strings.ReplaceAll(s, `"`+r.mount, `"`+dir+"/")
	}
	return []byte(s), pool, dir
}

// tlsTo returns the nats.go option of a client trusting pool.
func tlsTo(pool *x509.CertPool) nats.Option {
	return nats.Secure(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12})
}

func setUserPasswords(t *testing.T) {
	t.Helper()
	for k, v := range userPasswordEnv {
		t.Setenv(k, v)
	}
}

func TestNATSConfig_ServerConfigModeWithXKeyLoads(t *testing.T) {
	issuer := publicKey(t, nkeys.CreateAccount)
	xkey := publicKey(t, nkeys.CreateCurveKeys)
	p := DefaultParams()
	p.NATSCalloutIssuer, p.NATSCalloutXKey = issuer, xkey
	conf, err := RenderNATSConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	conf, pool := withTestCerts(t, conf, false)
	setUserPasswords(t)
	s, opts := serveRendered(t, conf)

	ac := opts.AuthCallout
	if ac == nil {
		t.Fatal("no auth_callout in the loaded configuration")
	}
	if ac.Issuer != issuer || ac.XKey != xkey || ac.Account != "AUTH" {
		t.Fatalf("auth_callout = issuer %s xkey %s account %s", ac.Issuer, ac.XKey, ac.Account)
	}
	if strings.Join(ac.AuthUsers, ",") != "compass-callout,compass-server,compass-kick" {
		t.Fatalf("auth_users = %v", ac.AuthUsers)
	}
	accountOf := map[string]string{}
	for _, u := range opts.Users {
		accountOf[u.Username] = u.Account.Name
	}
	if accountOf["compass-callout"] != "AUTH" || accountOf["compass-server"] != p.NATSAccount || accountOf["compass-kick"] != "SYS" {
		t.Fatalf("user accounts = %v, want callout in AUTH, server in %s and kick in SYS", accountOf, p.NATSAccount)
	}

	// The auth users connect with the passwords from the environment,
	// bypassing the callout; a wrong password does not.
	for _, c := range []struct{ user, pass string }{
		{"compass-callout", calloutTestPassword},
		{"compass-server", serverTestPassword},
		{"compass-kick", kickTestPassword},
	} {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(c.user, c.pass), tlsTo(pool), nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s cannot connect: %v", c.user, err)
		}
		nc.Close()
	}
	if nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("compass-server", "wrong"), tlsTo(pool), nats.NoReconnect(), nats.Timeout(10*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a wrong password connected")
	}
}

func TestNATSConfig_PlaceholdersAreRefused(t *testing.T) {
	conf, err := RenderNATSConfig(DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), PlaceholderIssuer) || !strings.Contains(string(conf), PlaceholderXKey) {
		t.Fatal("placeholders not rendered for missing public keys")
	}
	conf, _ = withTestCerts(t, conf, false)
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	setUserPasswords(t)
	// nats-server reads the auth_callout block's keys in map order and stops at
	// the first bad one, so either placeholder may be the one it names.
	_, err = server.ProcessConfigFile(path)
	if err == nil || (!strings.Contains(err.Error(), "valid public account nkey") && !strings.Contains(err.Error(), "valid public xkey")) {
		t.Fatalf("nats-server error = %v, want a placeholder key refused", err)
	}
}

// Client TLS is on whatever the URLs: with tls:// URLs, with a nats:// URL
// to loopback (nats.go upgrades a nats:// connection to a server that
// requires TLS), for one server and for a cluster. A client that does not
// speak TLS gets nothing past the INFO that says tls_required.
func TestNATSConfig_ClientTLSAlwaysOn(t *testing.T) {
	loopback := DefaultParams()
	loopback.NATSURL = "nats://127.0.0.1:4222"
	cluster := DefaultParams()
	cluster.NATSImage, cluster.NATSCluster = "nats:2.12.1-alpine", true
	for name, p := range map[string]Params{"tls URL": DefaultParams(), "nats:// to loopback": loopback, "cluster": cluster} {
		t.Run(name, func(t *testing.T) {
			p.NATSCalloutIssuer = publicKey(t, nkeys.CreateAccount)
			p.NATSCalloutXKey = publicKey(t, nkeys.CreateCurveKeys)
			conf, pool := withTestCerts(t, mustNATSConfig(t, p), p.natsServers() > 1)
			setUserPasswords(t)
			if p.natsServers() > 1 {
				setRouteEnv(t, p, testRoutePassword)
			}
			s, opts := serveRendered(t, conf)
			if opts.TLSConfig == nil || opts.TLSTimeout != 3 {
				t.Fatalf("client TLS = %v, timeout %v; want a TLS config with a 3 s handshake timeout", opts.TLSConfig != nil, opts.TLSTimeout)
			}
			if info := readINFO(t, s.Addr().String()); info["tls_required"] != true {
				t.Fatalf("INFO tls_required = %v, want true", info["tls_required"])
			}
			nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("compass-server", serverTestPassword), tlsTo(pool), nats.NoReconnect())
			if err != nil {
				t.Fatalf("TLS connect: %v", err)
			}
			if !nc.TLSRequired() {
				t.Fatal("the connection is not TLS")
			}
			nc.Close()
		})
	}

	// With in-cluster NATS, the TLS Secret the parameter names is mounted
	// where the config reads it.
	p := DefaultParams()
	p.NATSImage = "nats:2.12.1-alpine"
	p.NATSTLSSecret = "nats-cert-from-cert-manager"
	objs := rendered(t, p)
	cm := only[*corev1.ConfigMap](t, objs, p.CalloutNamespace, "compass-nats-config")
	if cm.Data["nats.conf"] != string(mustNATSConfig(t, p)) {
		t.Fatal("the ConfigMap's nats.conf differs from RenderNATSConfig")
	}
	spec := only[*appsv1.Deployment](t, objs, p.CalloutNamespace, "nats").Spec.Template.Spec
	checkSecretMount(t, spec, "tls", natsTLSDir, p.NATSTLSSecret)
}

// checkSecretMount checks that spec mounts Secret secret read-only at dir
// through the volume named volume, readable by owner and group only.
func checkSecretMount(t *testing.T, spec corev1.PodSpec, volume, dir, secret string) {
	t.Helper()
	var mounted, sourced bool
	for _, m := range spec.Containers[0].VolumeMounts {
		if m.Name == volume && m.MountPath == dir && m.ReadOnly {
			mounted = true
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == volume && v.Secret != nil && v.Secret.SecretName == secret && v.Secret.DefaultMode != nil && *v.Secret.DefaultMode == 0o440 {
			sourced = true
		}
	}
	if !mounted || !sourced {
		t.Fatalf("volume %s: mounted read-only at %s %v, from Secret %s with mode 0440 %v", volume, dir, mounted, secret, sourced)
	}
}

// readINFO reads the INFO a nats-server sends a new TCP connection first.
func readINFO(t *testing.T, addr string) map[string]any {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read INFO: %v", err)
	}
	var info map[string]any
	if !strings.HasPrefix(line, "INFO ") || json.Unmarshal([]byte(strings.TrimPrefix(line, "INFO ")), &info) != nil {
		t.Fatalf("first line %q is not an INFO", line)
	}
	return info
}

// The monitoring endpoint is on loopback by default, off or on every pod
// address when asked; only then does the pod name a monitor port.
func TestNATSConfig_MonitorLoopbackUnlessAsked(t *testing.T) {
	for _, tc := range []struct {
		monitor, host string
		port          int
	}{
		{"", "127.0.0.1", 8222},
		{NATSMonitorLoopback, "127.0.0.1", 8222},
		{NATSMonitorOff, "", 0},
		{NATSMonitorPod, "0.0.0.0", 8222},
	} {
		t.Run("monitor="+tc.monitor, func(t *testing.T) {
			p := DefaultParams()
			p.NATSMonitor = tc.monitor
			p.NATSCalloutIssuer = publicKey(t, nkeys.CreateAccount)
			p.NATSCalloutXKey = publicKey(t, nkeys.CreateCurveKeys)
			conf, _ := withTestCerts(t, mustNATSConfig(t, p), false)
			setUserPasswords(t)
			opts := processConfig(t, conf)
			if opts.HTTPPort != tc.port || opts.HTTPSPort != 0 || (tc.port != 0 && opts.HTTPHost != tc.host) {
				t.Fatalf("monitoring = %s:%d (https %d), want %s:%d", opts.HTTPHost, opts.HTTPPort, opts.HTTPSPort, tc.host, tc.port)
			}

			p.NATSImage = "nats:2.12.1-alpine"
			c := only[*appsv1.Deployment](t, rendered(t, p), p.CalloutNamespace, "nats").Spec.Template.Spec.Containers[0]
			var ports []string
			for _, cp := range c.Ports {
				ports = append(ports, fmt.Sprintf("%s/%d", cp.Name, cp.ContainerPort))
			}
			want := []string{"client/4222"}
			if tc.monitor == NATSMonitorPod {
				want = append(want, "monitor/8222")
			}
			if !slices.Equal(ports, want) {
				t.Fatalf("container ports = %v, want %v", ports, want)
			}
			for what, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
				if pr == nil || pr.TCPSocket == nil || pr.TCPSocket.Port != intstr.FromString("client") {
					t.Fatalf("%s probe = %+v, want a TCP probe of the client port", what, pr)
				}
			}
		})
	}
}

func mustNATSConfig(t *testing.T, p Params) []byte {
	t.Helper()
	c, err := RenderNATSConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeTestCert writes a self-signed certificate for localhost, 127.0.0.1
// and the default namespace's nats Service and headless names (server and
// client auth, as a route's both ends need) as tls.crt and tls.key, and
// itself as ca.crt, in dir, and returns a pool trusting it.
func writeTestCert(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost", "nats.compass-system.svc", "*.nats-headless.compass-system.svc"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "ca.crt"} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}
