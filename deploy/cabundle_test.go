package deploy_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/deploytest"
)

// configMaps are the rendered ConfigMaps named name, by namespace.
func configMaps(t *testing.T, out []byte, name string) map[string]corev1.ConfigMap {
	t.Helper()
	docs, err := deploytest.Documents(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]corev1.ConfigMap{}
	for _, doc := range docs {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal(doc, &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Kind == "ConfigMap" && cm.Name == name {
			got[cm.Namespace] = cm
		}
	}
	return got
}

// mountsConfigMap reports whether spec has a volume of ConfigMap name that
// container c mounts at /etc/compass/ca.
func mountsConfigMap(spec corev1.PodSpec, c corev1.Container, name string) bool {
	for _, v := range spec.Volumes {
		if v.ConfigMap == nil || v.ConfigMap.Name != name {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == v.Name && m.MountPath == "/etc/compass/ca" {
				return true
			}
		}
	}
	return false
}

// The CA given as PEM (--ca-bundle-file, caBundle) is rendered by the
// chart as ConfigMap compass-ca, key ca.crt, in the Runner's namespace and
// the callout's, so nothing has to exist in a namespace the chart creates
// before the install; the Runner and the callout mount it at
// /etc/compass/ca, where COMPASS_CA_FILE and COMPASS_NATS_CA_FILE point.
// Without it no such ConfigMap is rendered.
func TestRender_CABundleAsPEM(t *testing.T) {
	ca := deploytest.CAPEM(t)
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, []byte(ca), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	args := []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com", "--ca-bundle-file", file}
	if err := deploy.ManifestsCommand(context.Background(), args, &out, &bytes.Buffer{}); err != nil {
		t.Fatalf("manifests --ca-bundle-file: %v", err)
	}
	p := deploy.DefaultParams()
	got := configMaps(t, out.Bytes(), "compass-ca")
	for _, ns := range []string{p.Namespace, p.CalloutNamespace} {
		if cm, ok := got[ns]; !ok || cm.Data["ca.crt"] != ca {
			t.Fatalf("ConfigMap %s/compass-ca: rendered %v with ca.crt %q, want the file's PEM", ns, ok, cm.Data["ca.crt"])
		}
	}
	if len(got) != 2 {
		t.Fatalf("compass-ca rendered in %d namespaces, want 2", len(got))
	}

	p.CABundle = ca
	runner := deploytest.RenderedPod(t, p, "DaemonSet", deploy.RunnerDaemonSet)
	callout := deploytest.RenderedPod(t, p, "Deployment", "compass-callout")
	for _, w := range []struct {
		name string
		spec corev1.PodSpec
		env  string
	}{{"the Runner", runner, "COMPASS_CA_FILE"}, {"the callout", callout, "COMPASS_NATS_CA_FILE"}} {
		c := w.spec.Containers[0]
		if !mountsConfigMap(w.spec, c, "compass-ca") || plainEnv(c)[w.env] != "/etc/compass/ca/ca.crt" {
			t.Fatalf("%s: compass-ca mounted at /etc/compass/ca: %v; %s=%q", w.name, mountsConfigMap(w.spec, c, "compass-ca"), w.env, plainEnv(c)[w.env])
		}
	}

	plain, err := deploy.Render(deploy.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(configMaps(t, plain, "compass-ca")); n != 0 {
		t.Fatalf("compass-ca rendered in %d namespaces without a CA bundle", n)
	}
}

// A CA bundle that is not PEM certificates alone, or given both as PEM and
// as a ConfigMap, is refused by name, before anything renders.
func TestCABundleRefused(t *testing.T) {
	ca := deploytest.CAPEM(t)
	key := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not a key")}))
	for _, tc := range []struct {
		name string
		edit func(*deploy.Params)
		want string
	}{
		{"both", func(p *deploy.Params) { p.CABundle, p.CABundleConfigMap = ca, "my-ca" },
			"deploy: invalid parameters: CA bundle: given both as a file (--ca-bundle-file) and as a ConfigMap (--ca-configmap): give one"},
		{"no PEM", func(p *deploy.Params) { p.CABundle = "not a certificate" }, "deploy: invalid parameters: CA bundle: holds no PEM certificate"},
		{"a key", func(p *deploy.Params) { p.CABundle = ca + key }, "deploy: invalid parameters: CA bundle: holds a PEM PRIVATE KEY block: only certificates belong in it"},
		{"text after", func(p *deploy.Params) { p.CABundle = ca + "trailing" }, "deploy: invalid parameters: CA bundle: has text after its last PEM certificate"},
		{"bad certificate", func(p *deploy.Params) {
			p.CABundle = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}))
		}, "deploy: invalid parameters: CA bundle: certificate 1 does not parse: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := deploy.DefaultParams()
			p.ClusterName, p.ServerURL = "prod", "https://compass.example.com"
			tc.edit(&p)
			_, err := deploy.Render(p)
			if !errors.Is(err, deploy.ErrInvalidParams) || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("Render = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "BEGIN") {
				t.Fatal("the refusal repeats the bundle")
			}
		})
	}
}

// A --ca-bundle-file that cannot be read is refused by name, as a parameter.
func TestCABundleFileUnreadable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.crt")
	args := []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com", "--ca-bundle-file", missing}
	err := deploy.ManifestsCommand(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{})
	want := "deploy: invalid parameters: CA bundle: --ca-bundle-file: open " + missing + ": no such file or directory"
	if !errors.Is(err, deploy.ErrInvalidParams) || err.Error() != want {
		t.Fatalf("manifests with a missing CA file: %v, want %q", err, want)
	}
}
