package deploy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// startNATS loads conf with nats-server's own parser and runs it in-process
// on a random port, without the monitoring port.
func startNATS(t *testing.T, conf []byte) (*server.Server, *server.Options) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server refuses the rendered configuration: %v", err)
	}
	opts.Port = server.RANDOM_PORT
	opts.HTTPPort = 0
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return s, opts
}

func TestNATSConfig_ServerConfigModeWithXKeyLoads(t *testing.T) {
	issuer := publicKey(t, nkeys.CreateAccount)
	xkey := publicKey(t, nkeys.CreateCurveKeys)
	p := DefaultParams()
	p.NATSURL = "nats://nats.compass-system.svc:4222"
	p.NATSCalloutIssuer, p.NATSCalloutXKey = issuer, xkey
	conf, err := RenderNATSConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("COMPASS_CALLOUT_NATS_PASSWORD", "callout-test-password")
	t.Setenv("COMPASS_SERVER_NATS_PASSWORD", "server-test-password")
	s, opts := startNATS(t, conf)

	ac := opts.AuthCallout
	if ac == nil {
		t.Fatal("no auth_callout in the loaded configuration")
	}
	if ac.Issuer != issuer || ac.XKey != xkey || ac.Account != "AUTH" {
		t.Fatalf("auth_callout = issuer %s xkey %s account %s", ac.Issuer, ac.XKey, ac.Account)
	}
	if strings.Join(ac.AuthUsers, ",") != "compass-callout,compass-server" {
		t.Fatalf("auth_users = %v", ac.AuthUsers)
	}
	accountOf := map[string]string{}
	for _, u := range opts.Users {
		accountOf[u.Username] = u.Account.Name
	}
	if accountOf["compass-callout"] != "AUTH" || accountOf["compass-server"] != p.NATSAccount {
		t.Fatalf("user accounts = %v, want callout in AUTH and server in %s", accountOf, p.NATSAccount)
	}

	// The auth users connect with the passwords from the environment,
	// bypassing the callout; a wrong password does not.
	for _, c := range []struct{ user, pass string }{
		{"compass-callout", "callout-test-password"},
		{"compass-server", "server-test-password"},
	} {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(c.user, c.pass), nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s cannot connect: %v", c.user, err)
		}
		nc.Close()
	}
	if nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("compass-server", "wrong"), nats.NoReconnect(), nats.Timeout(10*time.Second)); err == nil {
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
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("COMPASS_CALLOUT_NATS_PASSWORD", "x")
	t.Setenv("COMPASS_SERVER_NATS_PASSWORD", "y")
	// nats-server reads the auth_callout block's keys in map order and stops at
	// the first bad one, so either placeholder may be the one it names.
	_, err = server.ProcessConfigFile(path)
	if err == nil || (!strings.Contains(err.Error(), "valid public account nkey") && !strings.Contains(err.Error(), "valid public xkey")) {
		t.Fatalf("nats-server error = %v, want a placeholder key refused", err)
	}
}

func TestNATSConfig_TLSWithTLSURL(t *testing.T) {
	p := DefaultParams() // tls:// URL
	p.NATSCalloutIssuer = publicKey(t, nkeys.CreateAccount)
	p.NATSCalloutXKey = publicKey(t, nkeys.CreateCurveKeys)
	conf, err := RenderNATSConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), `cert_file: "/etc/nats/tls/tls.crt"`) {
		t.Fatal("no tls block for a tls:// URL")
	}
	dir := t.TempDir()
	pool := writeTestCert(t, dir)
	conf = []byte(strings.ReplaceAll(string(conf), "/etc/nats/tls/", dir+"/"))
	t.Setenv("COMPASS_CALLOUT_NATS_PASSWORD", "callout-test-password")
	t.Setenv("COMPASS_SERVER_NATS_PASSWORD", "server-test-password")
	s, _ := startNATS(t, conf)
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("compass-server", "server-test-password"),
		nats.Secure(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}), nats.NoReconnect())
	if err != nil {
		t.Fatalf("TLS connect: %v", err)
	}
	nc.Close()

	// With in-cluster NATS, the TLS Secret is mounted where the config reads it.
	p.NATSImage = "nats:2.12.1-alpine"
	objs := rendered(t, p)
	cm := only[*corev1.ConfigMap](t, objs, p.CalloutNamespace, "compass-nats-config")
	if cm.Data["nats.conf"] != string(mustNATSConfig(t, p)) {
		t.Fatal("the ConfigMap's nats.conf differs from RenderNATSConfig")
	}
	var mounted bool
	for _, m := range only[*appsv1.Deployment](t, objs, p.CalloutNamespace, "nats").Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.Name == "tls" && m.MountPath == "/etc/nats/tls" && m.ReadOnly {
			mounted = true
		}
	}
	if !mounted {
		t.Fatal("the nats-server Deployment does not mount the TLS Secret at /etc/nats/tls")
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

// writeTestCert writes a self-signed localhost certificate as tls.crt and
// tls.key in dir and returns a pool trusting it.
func writeTestCert(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "localhost"},
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
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
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
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
