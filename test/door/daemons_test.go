package door_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/loopbackca"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// daemonOpts shapes startDaemons' two processes.
type daemonOpts struct {
	poll     time.Duration                // cluster-file poll (0: the default)
	loadHook func(verifier.LoadEvent)     // the callout's
	ready    func(server.ServeInfo) error // the Server's, before it reports ready
}

// daemons are compass-server (server.Serve) and compass-callout
// (callout.Serve, on an embedded nats-server in server-config mode) run in
// this process over the same cluster file, each as its own process would.
type daemons struct {
	doorURL     string
	doorClient  *http.Client
	natsURL     string
	serverAddr  string // metrics
	calloutAddr string // metrics
	serverHUP   chan os.Signal
	calloutHUP  chan os.Signal
	serverLog   *testlog.Buffer
	calloutLog  *testlog.Buffer
	serverDone  chan error // Serve's result, once it returns
	calloutDone chan error
}

func startDaemons(t *testing.T, clusters string, o daemonOpts) *daemons {
	t.Helper()
	dir := t.TempDir()
	d := &daemons{serverHUP: make(chan os.Signal), calloutHUP: make(chan os.Signal),
		serverLog: &testlog.Buffer{}, calloutLog: &testlog.Buffer{}}

	cert, caPEM, err := loopbackca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	d.doorClient = &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true,
	}}
	serverReady := make(chan server.ServeInfo, 1)
	serverDone := make(chan error, 1)
	d.serverDone = serverDone
	go func() {
		serverDone <- server.Serve(t.Context(), server.ServeConfig{
			Listen: "127.0.0.1:0", TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
			RunnerClusters: clusters, DataDir: filepath.Join(dir, "server"), MetricsAddr: "127.0.0.1:0",
			Logger: slog.New(slog.NewTextHandler(d.serverLog, nil)), ClusterFilePoll: o.poll, ReloadSignals: d.serverHUP,
			Ready: func(_ context.Context, si server.ServeInfo) error {
				_ = si.Verifier.Refresh(t.Context())
				if o.ready != nil {
					if err := o.ready(si); err != nil {
						return err
					}
				}
				serverReady <- si
				return nil
			},
		})
	}()

	ns := natsembed.ServeForProcess(t, dir)
	d.natsURL = ns.URL
	calloutReady := make(chan string, 1)
	calloutDone := make(chan error, 1)
	d.calloutDone = calloutDone
	cfg := ns.ServeConfig()
	cfg.RunnerClusters, cfg.MetricsAddr, cfg.Connections = clusters, "127.0.0.1:0", 1
	cfg.Logger = slog.New(slog.NewTextHandler(d.calloutLog, nil))
	cfg.ClusterFilePoll, cfg.ReloadSignals = o.poll, d.calloutHUP
	cfg.Ready = func(a string) { calloutReady <- a }
	cfg.LoadHook = o.loadHook
	go func() { calloutDone <- callout.Serve(t.Context(), cfg) }()

	for d.serverAddr == "" || d.calloutAddr == "" {
		select {
		case si := <-serverReady:
			d.serverAddr, d.doorURL = si.MetricsAddr, "https://"+si.DoorAddr
		case d.calloutAddr = <-calloutReady:
		case err := <-serverDone:
			t.Fatalf("server.Serve: %v\n%s", err, d.serverLog)
		case err := <-calloutDone:
			t.Fatalf("callout.Serve: %v\n%s", err, d.calloutLog)
		case <-time.After(waitFor):
			t.Fatal("the daemons did not become ready")
		}
	}
	return d
}
