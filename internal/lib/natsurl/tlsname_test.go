package natsurl_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/test/natsembed"
)

func TestTLSServerNamePinsTheOneHostName(t *testing.T) {
	for _, tc := range []struct {
		urls, want string
	}{
		{"tls://nats.compass-system.svc:4222", "nats.compass-system.svc"},
		{"tls://nats.compass-system.svc:4222, tls://10.0.0.7:4222", "nats.compass-system.svc"},
		{"tls://a.example:4222,tls://A.example:4222", "a.example"},
		{"wss://nats.example:443", "nats.example"},
		{"tls://a.example:4222,tls://b.example:4222", ""}, // two names: nats.go's own choice
		{"tls://10.0.0.7:4222,tls://[::1]:4222", ""},      // no name at all
		{"nats://localhost:4222", ""},                     // plaintext: nothing to verify
		{"tls://user:pass@nats.example:4222", "nats.example"},
		{"tls://%zz", ""}, // does not parse: CheckParse reports it
	} {
		t.Run(tc.urls, func(t *testing.T) {
			var o nats.Options
			if err := natsurl.TLSServerName(tc.urls)(&o); err != nil {
				t.Fatal(err)
			}
			got := ""
			if o.TLSConfig != nil {
				got = o.TLSConfig.ServerName
			}
			if got != tc.want {
				t.Errorf("ServerName %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("a ServerName already set is kept", func(t *testing.T) {
		o := nats.Options{TLSConfig: &tls.Config{ServerName: "mine"}}
		if err := natsurl.TLSServerName("tls://nats.example:4222")(&o); err != nil {
			t.Fatal(err)
		}
		if o.TLSConfig.ServerName != "mine" {
			t.Errorf("ServerName %q, want mine", o.TLSConfig.ServerName)
		}
	})
}

// A client of a TLS cluster whose certificate names only "localhost" (as
// the chart's names only the Service) reaches a server it learned while it
// was itself on a learned address: it starts on tls://localhost at n1, moves
// to n2 (learned as 127.0.0.1) when n1 stops, learns n3 there (a restarted
// pod with a new address), and when n2 stops too, n3 is the only server up.
// Without the pinned name, nats.go verifies n3 against "127.0.0.1", which
// the certificate does not carry, and never connects; with it, it does.
func TestTLSServerNameReachesServersLearnedOnAnAddress(t *testing.T) {
	cert, caFile := localhostOnlyCert(t)
	for _, tc := range []struct {
		name   string
		pinned bool
	}{
		{"unpinned, as nats.go does alone", false},
		{"pinned", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ports := testutil.FreePorts(t, 6)
			serve := func(i int, routeTo ...int) *server.Server {
				t.Helper()
				o := &server.Options{
					ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: ports[2*i],
					TLS: true, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
					TLSTimeout: 2, NoLog: true, NoSigs: true,
				}
				o.Cluster.Name, o.Cluster.Host, o.Cluster.Port = "c", "127.0.0.1", ports[2*i+1]
				for _, j := range routeTo {
					o.Routes = append(o.Routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*j+1])})
				}
				return natsembed.ServeOptions(t, o)
			}
			n1 := serve(0)
			n2 := serve(1, 0)
			waitRoutes(t, n2, 1, "n2's route to n1")

			reconnected := make(chan string, 8)
			opts := []nats.Option{
				nats.RootCAs(caFile), nats.DontRandomize(), nats.MaxReconnects(-1),
				nats.ReconnectWait(20 * time.Millisecond), nats.ReconnectJitter(0, 0),
				nats.ReconnectHandler(func(nc *nats.Conn) { reconnected <- nc.ConnectedServerName() }),
			}
			clientURL := fmt.Sprintf("tls://localhost:%d", ports[0])
			if tc.pinned {
				opts = append(opts, natsurl.TLSServerName(clientURL))
			}
			nc, err := nats.Connect(clientURL, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			waitFor(t, "the client to learn n2", func() bool { return learned(nc, ports[2]) })

			n1.Shutdown()
			if got := recv(t, reconnected, "the reconnect to n2"); got != "n2" {
				t.Fatalf("reconnected to %s, want n2", got)
			}
			n3 := serve(2, 1)
			waitRoutes(t, n3, 1, "n3's route to n2")
			waitFor(t, "the client on n2 to learn n3", func() bool { return learned(nc, ports[4]) })
			n2.Shutdown()

			if tc.pinned {
				if got := recv(t, reconnected, "the reconnect to n3"); got != "n3" {
					t.Fatalf("reconnected to %s, want n3", got)
				}
				return
			}
			// Unpinned: n3's certificate is checked against its address (a
			// handshake's error is the connection's last, not a reconnect
			// error's).
			waitFor(t, "an x509 refusal of n3's address", func() bool {
				var hostErr x509.HostnameError
				return errors.As(nc.LastError(), &hostErr) && hostErr.Host == "127.0.0.1"
			})
			if nc.IsConnected() {
				t.Fatalf("connected to %s without the pinned name: the case does not show the failure", nc.ConnectedServerName())
			}
		})
	}
}

// localhostOnlyCert is a serving certificate for the DNS name localhost
// alone (no IP SANs) and its CA's PEM file.
func localhostOnlyCert(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames:  []string{"localhost"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, caFile
}

// learned reports whether nc learned a server on port from INFO.
func learned(nc *nats.Conn, port int) bool {
	for _, u := range nc.DiscoveredServers() {
		if strings.HasSuffix(u, fmt.Sprintf(":%d", port)) {
			return true
		}
	}
	return false
}

const waitLimit = 10 * time.Second

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", waitLimit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitRoutes(t *testing.T, ns *server.Server, n int, what string) {
	t.Helper()
	waitFor(t, what, func() bool { return ns.NumRoutes() >= n })
}

func recv(t *testing.T, ch <-chan string, what string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(waitLimit):
		t.Fatalf("waited %s for %s", waitLimit, what)
		return ""
	}
}
