package deploy_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	natsconf "github.com/nats-io/nats-server/v2/conf"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/lib/loopbackca"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/test/natsembed"
)

// day2Wait bounds each wait on the real nats-server: a reload, a lame duck.
const day2Wait = 20 * time.Second

// natsParams are p's in-cluster nats-server parameters with real public
// keys, one server or a cluster.
func natsParams(t *testing.T, cluster bool) deploy.Params {
	t.Helper()
	p := deploy.DefaultParams()
	p.NATSImage, p.NATSCluster = deploy.NATSImage, cluster
	for _, k := range []struct {
		to     *string
		create func() (nkeys.KeyPair, error)
	}{{&p.NATSCalloutIssuer, nkeys.CreateAccount}, {&p.NATSCalloutXKey, nkeys.CreateCurveKeys}} {
		kp, err := k.create()
		if err != nil {
			t.Fatal(err)
		}
		if *k.to, err = kp.PublicKey(); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// natsPodOf renders p and returns the nats-server pod: the Deployment's, or
// the cluster's StatefulSet's.
func natsPodOf(t *testing.T, p deploy.Params) corev1.PodSpec {
	t.Helper()
	if p.NATSCluster {
		return renderedPod(t, p, "StatefulSet", "nats")
	}
	return renderedPod(t, p, "Deployment", "nats")
}

// argAfter is the argument after flag in args.
func argAfter(t *testing.T, args []string, flag string) string {
	t.Helper()
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("no %s in %v", flag, args)
	}
	return args[i+1]
}

// mountOf is the volume c mounts the directory holding path from, or "".
func mountOf(c corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(path, m.MountPath+"/") {
			return m.Name
		}
	}
	return ""
}

var certFileRE = regexp.MustCompile(`(?m)^\s*(?:cert_file|key_file|ca_file):\s*"([^"]+)"`)

// The rendered nats-server pods, one server and a cluster, are built for
// day 2: no file is mounted with subPath (which the kubelet never updates);
// the preStop hook puts nats-server in lame duck mode through the pid file
// its --pid names, on an emptyDir the reloader shares; the pod's grace
// period outlasts lame_duck_duration as nats-server itself reads it from the
// rendered configuration; and the reloader, the nats image itself, watches
// exactly the configuration file and every certificate and key the
// configuration names, each on a volume it mounts as the server does.
func TestRenderedNATSPodsLameDuckAndReload(t *testing.T) {
	for _, tc := range []struct {
		name             string
		cluster, gateway bool
	}{{"cluster false", false, false}, {"cluster true", true, false}, {"cluster with a gateway", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			p := natsParams(t, tc.cluster)
			if tc.gateway {
				p.NATSGateway, p.NATSGatewayName = true, "us-east"
				p.NATSGatewayRemotes = []deploy.NATSGatewayRemote{{Name: "eu-west", URLs: []string{"tls://nats-gateway.eu-west.example.com:7222"}}}
			}
			spec := natsPodOf(t, p)
			nc, rl := container(t, spec, "nats"), container(t, spec, "reloader")
			for _, c := range spec.Containers {
				for _, m := range c.VolumeMounts {
					if m.SubPath != "" {
						t.Errorf("%s mounts %s with subPath, which the kubelet never updates", c.Name, m.Name)
					}
				}
			}
			if spec.ShareProcessNamespace == nil || !*spec.ShareProcessNamespace {
				t.Fatal("the reloader cannot signal nats-server: the pod does not share its process namespace")
			}
			pid := argAfter(t, nc.Args, "--pid")
			if nc.Lifecycle == nil || nc.Lifecycle.PreStop == nil || nc.Lifecycle.PreStop.Exec == nil ||
				!slices.Equal(nc.Lifecycle.PreStop.Exec.Command, []string{"nats-server", "--signal", "ldm=" + pid}) {
				t.Fatalf("preStop = %+v, want nats-server --signal ldm=%s", nc.Lifecycle, pid)
			}
			run := mountOf(nc, pid)
			if run == "" || mountOf(rl, pid) != run {
				t.Fatalf("the pid file %s is on %q in nats-server and %q in the reloader, want one volume", pid, run, mountOf(rl, pid))
			}
			if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == run && v.EmptyDir != nil }) {
				t.Fatalf("the pid file's volume %s is not an emptyDir", run)
			}
			if rl.Image != p.NATSImage || envOf(rl, "COMPASS_NATS_PID_FILE") != pid {
				t.Fatalf("reloader: image %s, pid file %q; want %s and %s", rl.Image, envOf(rl, "COMPASS_NATS_PID_FILE"), p.NATSImage, pid)
			}

			conf, err := deploy.RenderNATSConfig(p)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "nats.conf")
			if err := os.WriteFile(path, conf, 0o600); err != nil {
				t.Fatal(err)
			}
			// nats-server's own parser, with the values the pod's environment
			// gives the configuration.
			for _, m := range regexp.MustCompile(`\$([A-Z_]+)`).FindAllStringSubmatch(string(conf), -1) {
				t.Setenv(m[1], "x")
			}
			parsed, err := natsconf.ParseFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var opts struct{ LameDuckDuration, LameDuckGracePeriod time.Duration }
			for k, to := range map[string]*time.Duration{"lame_duck_duration": &opts.LameDuckDuration, "lame_duck_grace_period": &opts.LameDuckGracePeriod} {
				v, _ := parsed[k].(string)
				if *to, err = time.ParseDuration(v); err != nil {
					t.Fatalf("%s = %v: %v", k, parsed[k], err)
				}
			}
			if opts.LameDuckDuration <= opts.LameDuckGracePeriod || opts.LameDuckGracePeriod <= 0 {
				t.Fatalf("lame duck %v after a grace of %v: nats-server wants a grace shorter than the duration", opts.LameDuckDuration, opts.LameDuckGracePeriod)
			}
			if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= opts.LameDuckDuration+10*time.Second {
				t.Fatalf("terminationGracePeriodSeconds %v: the kubelet would kill nats-server inside its %v of lame duck", g, opts.LameDuckDuration)
			}

			want := []string{argAfter(t, nc.Args, "--config")}
			for _, m := range certFileRE.FindAllStringSubmatch(string(conf), -1) {
				want = append(want, m[1])
			}
			if len(rl.Command) < 4 || rl.Command[0] != "sh" || rl.Command[1] != "-c" || rl.Command[3] != "reloader" {
				t.Fatalf("reloader command = %q", rl.Command)
			}
			if got := rl.Command[4:]; !slices.Equal(got, want) {
				t.Fatalf("the reloader watches %v, want the configuration and what it reads: %v", got, want)
			}
			for _, f := range want {
				if v := mountOf(rl, f); v == "" || v != mountOf(nc, f) {
					t.Errorf("%s: on volume %q in the reloader, %q in nats-server", f, v, mountOf(nc, f))
				}
			}
		})
	}
}

func envOf(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// secretDir lays out a Secret's files as the kubelet's atomic writer does:
// the data in a timestamped directory, ..data a symlink to it, and each
// file a symlink through ..data. update swaps ..data in one rename.
type secretDir struct {
	t   *testing.T
	dir string
	n   int
}

func (s *secretDir) update(files map[string][]byte) {
	s.t.Helper()
	s.n++
	ts := fmt.Sprintf("..2026_12_03_%02d", s.n)
	if err := os.Mkdir(filepath.Join(s.dir, ts), 0o700); err != nil {
		s.t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(s.dir, ts, name), b, 0o600); err != nil {
			s.t.Fatal(err)
		}
		link := filepath.Join(s.dir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				s.t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		s.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		s.t.Fatal(err)
	}
}

// servingPair is a loopback serving certificate (tls.crt, tls.key) from a
// fresh CA, and that CA.
func servingPair(t *testing.T) (map[string][]byte, *x509.CertPool, *x509.Certificate) {
	t.Helper()
	cert, caPEM, err := loopbackca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var chain bytes.Buffer
	for _, der := range cert.Certificate {
		_ = pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return map[string][]byte{"tls.crt": chain.Bytes(), "tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})}, pool, leaf
}

// day2Server runs the real nats-server on the rendered single-server
// configuration, its client certificate in a Secret-like directory, its
// client port and monitoring moved to free loopback ports, and extra
// appended: it returns the Secret directory, the configuration file (which
// the reloader watches) and the pid file startDay2 writes.
func day2Server(t *testing.T, p deploy.Params, extra string) (*secretDir, string, string) {
	t.Helper()
	conf, err := deploy.RenderNATSConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	tlsDir := &secretDir{t: t, dir: filepath.Join(root, "tls")}
	if err := os.Mkdir(tlsDir.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(conf), `"/etc/nats/tls/`, `"`+tlsDir.dir+"/")
	s = regexp.MustCompile(`(?m)^port: \d+$`).ReplaceAllString(s, `listen: "127.0.0.1:-1"`)
	s = regexp.MustCompile(`(?m)^http: .*$`).ReplaceAllString(s, `http: "127.0.0.1:-1"`)
	s += extra
	confFile := filepath.Join(root, "nats.conf")
	if err := os.WriteFile(confFile, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"COMPASS_CALLOUT_NATS_PASSWORD": "callout-pw", "COMPASS_SERVER_NATS_PASSWORD": "server-pw", "COMPASS_KICK_NATS_PASSWORD": "kick-pw"} {
		t.Setenv(k, v)
	}
	return tlsDir, confFile, filepath.Join(root, "nats.pid")
}

// startDay2 starts the server day2Server prepared, once its certificate is
// in place, and writes its pid file as --pid would.
func startDay2(t *testing.T, confFile, pidFile string) *natsembed.Process {
	t.Helper()
	b, err := os.ReadFile(confFile)
	if err != nil {
		t.Fatal(err)
	}
	ns := natsembed.StartProcess(t, string(b))
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(ns.PID())), 0o600); err != nil {
		t.Fatal(err)
	}
	return ns
}

// imageCommand is a command of a container of the nats image: argv[0]
// found on a PATH that has nats-server (and the system's sh), env added.
func imageCommand(t *testing.T, argv []string, env ...string) *exec.Cmd {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(natsembed.Binary(t), filepath.Join(dir, "nats-server")); err != nil {
		t.Fatal(err)
	}
	path := dir + string(os.PathListSeparator) + os.Getenv("PATH")
	bin := argv[0]
	for _, d := range filepath.SplitList(path) {
		if _, err := os.Stat(filepath.Join(d, argv[0])); err == nil {
			bin = filepath.Join(d, argv[0])
			break
		}
	}
	cmd := exec.CommandContext(t.Context(), bin, argv[1:]...)
	cmd.Env = append([]string{"PATH=" + path}, env...)
	return cmd
}

// servedSerial connects to ns as the Server's user, trusting pool, and
// returns the serial of the certificate it was served, and the connection.
func servedSerial(t *testing.T, url string, pool *x509.CertPool) (string, *nats.Conn, error) {
	nc, err := nats.Connect(url, nats.UserInfo("compass-server", "server-pw"),
		nats.Secure(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}), nats.Timeout(5*time.Second))
	if err != nil {
		return "", nil, err
	}
	st, err := nc.TLSConnectionState()
	if err != nil || len(st.PeerCertificates) == 0 {
		nc.Close()
		return "", nil, fmt.Errorf("no peer certificate: %v", err)
	}
	return st.PeerCertificates[0].SerialNumber.String(), nc, nil
}

// A renewed certificate Secret reaches nats-server without a restart: the
// real nats-server runs the rendered configuration, its certificate in a
// directory laid out as the kubelet lays out a Secret, and the rendered
// reloader command runs beside it (sh, with nats-server on its PATH, its
// round shortened from the rendered 10 s to 1 s). The Secret is renewed the
// kubelet's way (a new data directory, ..data swapped in one rename): new
// connections are then served the new certificate, the process is the same,
// and the connection made before the renewal is still up.
func TestRenderedReloaderServesARenewedCertificate(t *testing.T) {
	p := natsParams(t, false)
	rl := container(t, natsPodOf(t, p), "reloader")
	tlsDir, confFile, pidFile := day2Server(t, p, "")
	oldFiles, oldPool, oldLeaf := servingPair(t)
	tlsDir.update(oldFiles)
	ns := startDay2(t, confFile, pidFile)

	watched := []string{confFile, filepath.Join(tlsDir.dir, "tls.crt"), filepath.Join(tlsDir.dir, "tls.key")}
	if len(rl.Command) != 4+len(watched) {
		t.Fatalf("the reloader watches %v; this test stands in for %d files", rl.Command[4:], len(watched))
	}
	cmd := imageCommand(t, append(slices.Clone(rl.Command[:4]), watched...), "COMPASS_NATS_PID_FILE="+pidFile, "COMPASS_NATS_RELOAD_EVERY=1")
	var out testlog.Buffer // written by the reloader while the test reads it
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	// The reloader compares with the hash it took when it started: renewing
	// before it took it would be no change to it.
	testutil.Eventually(t, day2Wait, "the reloader's first hash", func() bool {
		return strings.Contains(out.String(), fmt.Sprintf("reloader: watching %d files every 1s", len(watched)))
	})

	serial, before, err := servedSerial(t, ns.URL, oldPool)
	if err != nil || serial != oldLeaf.SerialNumber.String() {
		t.Fatalf("before the renewal: serial %s, %v; want %s", serial, err, oldLeaf.SerialNumber)
	}
	defer before.Close()

	newFiles, newPool, newLeaf := servingPair(t)
	tlsDir.update(newFiles)
	testutil.Eventually(t, day2Wait, "the renewed certificate served", func() bool {
		serial, nc, err := servedSerial(t, ns.URL, newPool)
		if err != nil {
			return false
		}
		nc.Close()
		return serial == newLeaf.SerialNumber.String()
	})
	// The reloader says so once the signal it sent returned, which may be
	// after the new certificate is served.
	testutil.Eventually(t, day2Wait, "the reloader's and nats-server's reload lines", func() bool {
		return strings.Contains(out.String(), "reloader: the configuration or a certificate changed: nats-server reloads") &&
			strings.Contains(ns.Log(), "Reloaded server configuration")
	})
	if b, _ := os.ReadFile(pidFile); string(b) != strconv.Itoa(ns.PID()) {
		t.Fatal("the server was restarted")
	}
	if !before.IsConnected() {
		t.Fatal("the connection made before the renewal was dropped")
	}
}

// The rendered preStop command puts the real nats-server in lame duck mode:
// run against the rendered configuration (its grace period shortened to
// 1 s; lame_duck_duration stays the rendered 30 s, nats-server's least),
// with nats-server on the PATH as in the nats image, it returns at once; the server stops accepting clients, tells the connected ones (nats.go
// reports lame duck mode), closes them, and exits by itself.
func TestRenderedPreStopPutsNATSInLameDuck(t *testing.T) {
	p := natsParams(t, false)
	nc := container(t, natsPodOf(t, p), "nats")
	tlsDir, confFile, pidFile := day2Server(t, p, "\nlame_duck_grace_period: \"1s\"\n")
	files, pool, _ := servingPair(t)
	tlsDir.update(files)
	ns := startDay2(t, confFile, pidFile)

	const clients = 5
	ldm := make(chan struct{}, clients)
	var conns []*nats.Conn
	for range clients {
		c, err := nats.Connect(ns.URL, nats.UserInfo("compass-server", "server-pw"), nats.NoReconnect(),
			nats.Secure(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}),
			nats.LameDuckModeHandler(func(*nats.Conn) { ldm <- struct{}{} }))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	hook := slices.Clone(nc.Lifecycle.PreStop.Exec.Command)
	hook[len(hook)-1] = "ldm=" + pidFile // the pid file's place in this test
	cmd := imageCommand(t, hook)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the preStop command: %v\n%s", err, out)
	}
	for range clients {
		select {
		case <-ldm:
		case <-time.After(day2Wait):
			t.Fatalf("not every client was told of lame duck mode; nats-server log:\n%s", ns.Log())
		}
	}
	testutil.Eventually(t, day2Wait, "every client closed and nats-server exited", func() bool {
		for _, c := range conns {
			if !c.IsClosed() {
				return false
			}
		}
		return strings.Contains(ns.Log(), "Server Exiting")
	})
	for _, want := range []string{"Entering lame duck mode, stop accepting new clients", "Closing existing clients"} {
		if !strings.Contains(ns.Log(), want) {
			t.Fatalf("nats-server did not log %q:\n%s", want, ns.Log())
		}
	}
}
