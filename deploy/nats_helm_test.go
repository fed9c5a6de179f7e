package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// helmValues is every key RenderNATSHelmValues sets, as the nats chart's
// values.yaml (1.x) names them; strict decoding refuses any other.
type helmValues struct {
	FullnameOverride string `json:"fullnameOverride"`
	NatsBox          struct {
		Enabled bool `json:"enabled"`
	} `json:"natsBox"`
	Config struct {
		Nats struct {
			Port int     `json:"port"`
			TLS  helmTLS `json:"tls"`
		} `json:"nats"`
		Monitor *struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"monitor"`
		Cluster struct {
			Enabled  bool           `json:"enabled"`
			Replicas int            `json:"replicas"`
			Port     int            `json:"port"`
			TLS      *helmTLS       `json:"tls"`
			Merge    map[string]any `json:"merge"`
		} `json:"cluster"`
		Merge map[string]any `json:"merge"`
	} `json:"config"`
	Container struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
		Env map[string]helmEnv `json:"env"`
	} `json:"container"`
}

type helmTLS struct {
	Enabled    bool   `json:"enabled"`
	SecretName string `json:"secretName"`
	CA         string `json:"ca"`
}

// helmEnv is a container.env entry: a string, or a map with valueFrom.
type helmEnv struct {
	Value     string
	ValueFrom *corev1.EnvVarSource
}

func (e *helmEnv) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &e.Value); err == nil {
		return nil
	}
	var m struct {
		ValueFrom *corev1.EnvVarSource `json:"valueFrom"`
	}
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.DisallowUnknownFields()
	if err := d.Decode(&m); err != nil {
		return err
	}
	e.ValueFrom = m.ValueFrom
	return nil
}

func helmValuesOf(t *testing.T, p Params) helmValues {
	t.Helper()
	out, err := RenderNATSHelmValues(p)
	if err != nil {
		t.Fatalf("RenderNATSHelmValues: %v", err)
	}
	var v helmValues
	if err := yaml.UnmarshalStrict(out, &v); err != nil {
		t.Fatalf("strict decode of the Helm values: %v", err)
	}
	return v
}

// chartEnv is the nats container's environment as the chart writes it: its
// own POD_NAME first, then container.env sorted by name (a Go template ranges
// over a map in key order).
func chartEnv(v helmValues) []corev1.EnvVar {
	env := []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	for _, k := range slices.Sorted(maps.Keys(v.Container.Env)) {
		env = append(env, corev1.EnvVar{Name: k, Value: v.Container.Env[k].Value, ValueFrom: v.Container.Env[k].ValueFrom})
	}
	return env
}

// chartConfig is this test's model of the nats.conf the chart builds from
// the values, after its files/config/{config,cluster,tls}.yaml (1.x): its
// own server_name, lame-duck and pid settings, port, client tls, the cluster
// block (name, port, no_advertise, its route list, tls with ca_file and
// verify when ca is set) with cluster.merge over it, http_port when monitor
// is on, config.merge over the whole, written as JSON with every "<< x >>"
// string unquoted. The certificates are read from dir. It is a model, not
// the chart: Helm does not run here.
func chartConfig(t *testing.T, v helmValues, dir string) []byte {
	t.Helper()
	tlsBlock := func(h helmTLS) map[string]any {
		b := map[string]any{"cert_file": dir + "/tls.crt", "key_file": dir + "/tls.key"}
		if h.CA != "" {
			b["ca_file"], b["verify"] = dir+"/"+h.CA, true
		}
		return b
	}
	conf := map[string]any{
		"server_name": "<< $POD_NAME >>", "lame_duck_grace_period": "10s", "lame_duck_duration": "30s",
		"pid_file": "/var/run/nats/nats.pid", "port": v.Config.Nats.Port,
	}
	if v.Config.Nats.TLS.Enabled {
		conf["tls"] = tlsBlock(v.Config.Nats.TLS)
	}
	if c := v.Config.Cluster; c.Enabled {
		var routes []any
		for i := range c.Replicas {
			routes = append(routes, fmt.Sprintf("tls://%s-%d.%s-headless:6222", v.FullnameOverride, i, v.FullnameOverride))
		}
		block := map[string]any{"name": v.FullnameOverride, "port": c.Port, "no_advertise": true, "routes": routes}
		if c.TLS != nil && c.TLS.Enabled {
			block["tls"] = tlsBlock(*c.TLS)
		}
		maps.Copy(block, c.Merge)
		conf["cluster"] = block
	}
	if m := v.Config.Monitor; m == nil || m.Enabled {
		conf["http_port"] = 8222
		if m != nil && m.Port != 0 {
			conf["http_port"] = m.Port
		}
	}
	maps.Copy(conf, v.Config.Merge)
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(conf); err != nil {
		t.Fatal(err)
	}
	return regexp.MustCompile(`"<< (.*?) >>"`).ReplaceAll(out.Bytes(), []byte("$1"))
}

// loadWithEnv sets env in the test's environment and loads conf.
func loadWithEnv(t *testing.T, conf []byte, env map[string]string) *server.Options {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	return processConfig(t, conf)
}

// The Helm values carry the rendered configuration: loaded the way the chart
// would write them, nats-server ends with the same client TLS, monitoring,
// accounts, auth_callout and, for a cluster, the same routes, route user and
// password and mutual route TLS as from the rendered ConfigMap; the real
// binary accepts them; and no secret is in the values.
func TestNATSHelmValues_CarryTheRenderedConfig(t *testing.T) {
	issuer := publicKey(t, nkeys.CreateAccount)
	xkey := publicKey(t, nkeys.CreateCurveKeys)
	single := DefaultParams()
	single.NATSCalloutIssuer, single.NATSCalloutXKey = issuer, xkey
	podMonitor := single
	podMonitor.NATSMonitor = NATSMonitorPod
	noMonitor := single
	noMonitor.NATSMonitor = NATSMonitorOff
	for name, p := range map[string]Params{
		"single server": single, "monitor on the pod": podMonitor, "no monitor": noMonitor,
		"cluster": clusterParams(t, issuer, xkey),
	} {
		t.Run(name, func(t *testing.T) {
			clustered := p.natsServers() > 1
			v := helmValuesOf(t, p)
			if v.FullnameOverride != "nats" || v.NatsBox.Enabled || !v.Config.Nats.TLS.Enabled || v.Config.Nats.TLS.SecretName != p.NATSTLSSecret ||
				v.Config.Cluster.Enabled != clustered {
				t.Fatalf("values = %+v", v)
			}
			if img := v.Container.Image.Repository + ":" + v.Container.Image.Tag; img != NATSImage {
				t.Fatalf("the chart's image = %s, want the tested %s", img, NATSImage)
			}
			if clustered && (v.Config.Cluster.Replicas != p.natsServers() || v.Config.Cluster.TLS == nil || v.Config.Cluster.TLS.SecretName != p.NATSRouteTLSSecret) {
				t.Fatalf("cluster values = %+v", v.Config.Cluster)
			}

			// The environment, as the kubelet resolves the chart's.
			env := kubeletEnv(t, corev1.Container{Env: chartEnv(v)}, secretsWithRoute(testRoutePassword), map[string]string{"metadata.name": "nats-0"})
			for k, val := range env {
				if strings.Contains(val, "$(") {
					t.Fatalf("env %s = %q keeps an unexpanded reference: the chart's name order defines it before what it names", k, val)
				}
			}
			fromHelm := chartConfig(t, v, "")
			fromHelm, _, _ = withTestCertsDirIn(t, fromHelm, "")
			helmOpts := loadWithEnv(t, fromHelm, env)

			conf, _ := withTestCerts(t, mustNATSConfig(t, p), clustered)
			podEnv := map[string]string{}
			maps.Copy(podEnv, userPasswordEnv)
			if clustered {
				podEnv = clusterPodEnv(t, p, testRoutePassword)
			}
			renderedOpts := loadWithEnv(t, conf, podEnv)

			same := func(what string, a, b any) {
				t.Helper()
				ja, _ := json.Marshal(a)
				jb, _ := json.Marshal(b)
				if string(ja) != string(jb) {
					t.Fatalf("%s: Helm values give %s, the rendered configuration %s", what, ja, jb)
				}
			}
			same("auth_callout", helmOpts.AuthCallout, renderedOpts.AuthCallout)
			same("authorization timeout", helmOpts.AuthTimeout, renderedOpts.AuthTimeout)
			same("system account", helmOpts.SystemAccount, renderedOpts.SystemAccount)
			same("users", usersOf(helmOpts), usersOf(renderedOpts))
			same("monitoring", monitorOf(helmOpts), monitorOf(renderedOpts))
			same("client TLS", helmOpts.TLSConfig != nil, renderedOpts.TLSConfig != nil)
			if helmOpts.TLSConfig == nil {
				t.Fatal("no client TLS")
			}
			same("route user", helmOpts.Cluster.Username+"/"+helmOpts.Cluster.Password, renderedOpts.Cluster.Username+"/"+renderedOpts.Cluster.Password)
			same("routes", routesOf(helmOpts), routesOf(renderedOpts))
			same("cluster no_advertise", helmOpts.Cluster.NoAdvertise, renderedOpts.Cluster.NoAdvertise)
			same("route mutual TLS", helmOpts.Cluster.TLSConfig != nil && helmOpts.Cluster.TLSConfig.ClientCAs != nil, renderedOpts.Cluster.TLSConfig != nil && renderedOpts.Cluster.TLSConfig.ClientCAs != nil)
			if clustered && len(helmOpts.Routes) != p.natsServers() {
				t.Fatalf("routes from the Helm values = %v", routesOf(helmOpts))
			}

			if out, ok := checkConfig(t, fromHelm, env); !ok {
				t.Fatalf("nats-server -t refuses the configuration modelled from the Helm values:\n%s", out)
			}
			raw, err := RenderNATSHelmValues(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, secret := range []string{testRoutePassword, "callout-test-password", "server-test-password", "kick-test-password"} {
				if strings.Contains(string(raw), secret) {
					t.Fatal("a secret is in the Helm values")
				}
			}
			if seedRE.Match(raw) {
				t.Fatal("the Helm values contain something shaped like an nkey seed")
			}
		})
	}
}

// withTestCertsDirIn writes the test certificate into a new directory and
// points conf's relative "/tls.crt", "/tls.key" and "/ca.crt" (as
// chartConfig writes them for dir prefix) at it.
func withTestCertsDirIn(t *testing.T, conf []byte, prefix string) ([]byte, string, int) {
	t.Helper()
	dir := t.TempDir()
	writeTestCert(t, dir)
	s := string(conf)
	n := 0
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		old := `"` + prefix + "/" + f + `"`
		n += strings.Count(s, old)
		s = strings.ReplaceAll(s, old, `"`+filepath.Join(dir, f)+`"`)
	}
	if n == 0 {
		t.Fatal("the configuration reads no certificate")
	}
	return []byte(s), dir, n
}

// usersOf is every user of o by name: its account, password and permissions.
func usersOf(o *server.Options) map[string]string {
	m := map[string]string{}
	for _, u := range o.Users {
		perms, _ := json.Marshal(u.Permissions)
		m[u.Username] = u.Account.Name + "/" + u.Password + "/" + string(perms)
	}
	return m
}

func routesOf(o *server.Options) []string {
	var r []string
	for _, u := range o.Routes {
		r = append(r, u.String())
	}
	return r
}

// monitorOf is where o's monitoring endpoint listens; http_port alone listens
// where the clients do, every address unless a host is set.
func monitorOf(o *server.Options) string {
	if o.HTTPPort == 0 {
		return "off"
	}
	host := o.HTTPHost
	if host == "" {
		host = o.Host
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return fmt.Sprintf("%s:%d", host, o.HTTPPort)
}
