package deploy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/compass-runner/identity/internal/lib/natsurl"
)

// A Runner's token never crosses a network in clear text: a nats:// URL (or
// a schemeless one, which nats.go reads as nats://) is refused unless it is
// to loopback, WebSocket URLs are refused (a Runner's user JWT allows
// standard connections only), and no error repeats a URL's credentials.
func TestRender_NATSURLMustBeSealed(t *testing.T) {
	for _, tc := range []struct {
		urls      string
		plaintext bool   // refused by natsurl.CheckSealed as plaintext
		want      string // the error, after "deploy: invalid parameters: NATS URL: "; empty: accepted
	}{
		{"tls://nats.compass-system.svc:4222", false, ""},
		{"tls://a.example:4222,tls://b.example:4222", false, ""},
		{"nats://127.0.0.1:4222", false, ""},
		{"nats://localhost:4222", false, ""},
		{"nats://[::1]:4222", false, ""},
		{"nats://nats.compass-system.svc:4222", true, "natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://nats.compass-system.svc:4222"},
		{"tls://a.example:4222,nats://10.0.0.7:4222", true, "natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://10.0.0.7:4222"},
		{"nats.compass-system.svc:4222", true, "natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://nats.compass-system.svc:4222"},
		{"ws://nats.example.com:8080", true, "natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): ws://nats.example.com:8080"},
		{"nats://runner:s3cret-pw@nats.example.com:4222", true, "natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://nats.example.com:4222"},
		{"tls://runner:s3cret-pw@nats.example.com:4222", false, "URL 1 of the list carries credentials (the Runner and the callout read theirs from files)"},
		{"tls://a.example:4222,tls://s3cret-pw@b.example:4222", false, "URL 2 of the list carries credentials (the Runner and the callout read theirs from files)"},
		{"wss://nats.example.com:443", false, "wss://nats.example.com:443: a Runner's user JWT allows standard connections only, not WebSocket; use tls://"},
		{"127.0.0.1:4222", false, "URL 1 of the list is not a URL of the form tls://host:port"},
		{"tcp://127.0.0.1:4222", false, "natsurl: tcp://127.0.0.1:4222: unknown scheme \"tcp\" (want tls://, wss://, or nats:// to loopback)"},
		{"tls://nats.example.com:4222/path", false, "URL 1 of the list must be tls://host:port, without path, query, space or quote"},
	} {
		t.Run(tc.urls, func(t *testing.T) {
			p := DefaultParams()
			p.NATSURL = tc.urls
			err := p.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				rendered(t, p)
				return
			}
			if err == nil || err.Error() != "deploy: invalid parameters: NATS URL: "+tc.want {
				t.Fatalf("error = %v\nwant    deploy: invalid parameters: NATS URL: %s", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidParams) || errors.Is(err, natsurl.ErrPlaintext) != tc.plaintext {
				t.Fatalf("error %v: ErrInvalidParams %v, natsurl.ErrPlaintext %v (want %v)", err, errors.Is(err, ErrInvalidParams), errors.Is(err, natsurl.ErrPlaintext), tc.plaintext)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatal("the error shows the URL's credentials")
			}
		})
	}
}

// The Runner's health listener and the callout's metrics listener bind the
// pod's own IP, from the downward API, explicitly: the daemons' defaults are
// (or will be) loopback, which the kubelet's probes and Prometheus cannot
// reach. The address is bracketed, so an IPv6 pod IP works as well as IPv4.
func TestRender_DaemonListenersBindPodIP(t *testing.T) {
	p := DefaultParams()
	objs := rendered(t, p)
	for _, tc := range []struct {
		what, addrEnv, port string
		c                   corev1.Container
	}{
		{"Runner", "COMPASS_HEALTH_ADDR", "8081", runnerDaemonSet(t, objs, p.Namespace).Spec.Template.Spec.Containers[0]},
		{"callout", "COMPASS_METRICS_ADDR", "9090", only[*appsv1.Deployment](t, objs, p.CalloutNamespace, "compass-callout").Spec.Template.Spec.Containers[0]},
	} {
		t.Run(tc.what, func(t *testing.T) {
			podIP, addr := -1, -1
			var listenEnv []corev1.EnvVar
			for i, e := range tc.c.Env {
				switch e.Name {
				case podIPEnv:
					if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
						t.Fatalf("%s = %+v, want the downward API's status.podIP", podIPEnv, e)
					}
					podIP = i
					listenEnv = append(listenEnv, e)
				case tc.addrEnv:
					if want := "[$(" + podIPEnv + ")]:" + tc.port; e.Value != want {
						t.Fatalf("%s = %q, want %q", tc.addrEnv, e.Value, want)
					}
					addr = i
					listenEnv = append(listenEnv, e)
				}
			}
			if podIP < 0 || addr < podIP {
				t.Fatalf("%s at %d, %s at %d: the pod IP must be defined first for the kubelet to expand it", podIPEnv, podIP, tc.addrEnv, addr)
			}
			if len(tc.c.Ports) != 1 || strconv.Itoa(int(tc.c.Ports[0].ContainerPort)) != tc.port {
				t.Fatalf("ports = %+v, want the listener's %s", tc.c.Ports, tc.port)
			}
			// What the kubelet makes of it for an IPv4 and an IPv6 pod is an
			// address Go listens on.
			for _, ip := range []string{"127.0.0.1", "::1"} {
				env := kubeletEnv(t, corev1.Container{Env: listenEnv}, nil, map[string]string{"status.podIP": ip})
				a := strings.Replace(env[tc.addrEnv], ":"+tc.port, ":0", 1)
				ln, err := net.Listen("tcp", a)
				if err != nil {
					if ip == "::1" && strings.Contains(err.Error(), "assign requested address") {
						t.Logf("no IPv6 loopback here: %v", err)
						continue
					}
					t.Fatalf("listen on %q (pod IP %s): %v", a, ip, err)
				}
				ln.Close()
			}
		})
	}
}

// The NATS flags reach the Params, and --nats-helm-values prints the Helm
// values for them instead of the manifests.
func TestManifestsCommand_NATSFlags(t *testing.T) {
	args := []string{
		"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443",
		"--nats-image", "nats:2.12.1", "--nats-cluster", "--nats-replicas", "5", "--nats-monitor", "pod",
		"--nats-tls-secret", "nats-client-cert", "--nats-route-tls-secret", "nats-route-cert",
	}
	p := DefaultParams()
	p.NATSImage, p.NATSCluster, p.NATSReplicas, p.NATSMonitor = "nats:2.12.1", true, 5, NATSMonitorPod
	p.NATSTLSSecret, p.NATSRouteTLSSecret = "nats-client-cert", "nats-route-cert"
	for _, tc := range []struct {
		extra  []string
		render func(Params) ([]byte, error)
	}{{nil, Render}, {[]string{"--nats-helm-values"}, RenderNATSHelmValues}} {
		var stdout, stderr bytes.Buffer
		if err := ManifestsCommand(context.Background(), append(slices.Clone(args), tc.extra...), &stdout, &stderr); err != nil {
			t.Fatalf("ManifestsCommand %v: %v (stderr %q)", tc.extra, err, stderr.String())
		}
		want, err := tc.render(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(stdout.Bytes(), want) {
			t.Fatalf("ManifestsCommand %v differs from rendering the same parameters", tc.extra)
		}
	}
	var stdout, stderr bytes.Buffer
	err := ManifestsCommand(context.Background(), []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443", "--nats-cluster"}, &stdout, &stderr)
	if !errors.Is(err, ErrInvalidParams) || !strings.HasPrefix(err.Error(), "deploy: invalid parameters: NATS replicas: a cluster of 3 is rendered only with an in-cluster nats-server") || stdout.Len() != 0 {
		t.Fatalf("--nats-cluster without --nats-image: %v (stdout %d bytes)", err, stdout.Len())
	}
}
