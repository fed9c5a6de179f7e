package deploy_test

import (
	"bytes"
	"flag"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

// serverPod renders p and returns the Server's pod spec.
func serverPod(t *testing.T, p deploy.Params) corev1.PodSpec {
	t.Helper()
	return renderedPod(t, p, "", deploy.ServerName)
}

// commandEnv is every variable compass-server's subcommand name reads: its
// flags' COMPASS_* fallbacks and its environment-only variables.
func commandEnv(t *testing.T, name string) map[string]bool {
	t.Helper()
	for _, c := range commands.Server.Subcommands {
		if c.Name != name {
			continue
		}
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		c.Flags(fs)
		env := map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) { env[cli.EnvName(f.Name)] = true })
		for _, e := range c.Env {
			env[e.Name] = true
		}
		return env
	}
	t.Fatalf("compass-server has no %s command", name)
	return nil
}

// TestRender_ServerEnvNamesFlags: every COMPASS_* variable the rendered
// Server and migrate containers set is one compass-server serve or migrate
// reads, so a renamed flag cannot leave the manifests setting nothing.
// COMPASS_POD_IP is the pod's own, expanded into COMPASS_METRICS_ADDR.
func TestRender_ServerEnvNamesFlags(t *testing.T) {
	for _, secret := range []string{"", "compass-server-database"} {
		p := deploy.DefaultParams()
		p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
		p.CABundleConfigMap = "compass-ca"
		p.ServerDatabaseSecret = secret
		if secret != "" {
			p.DatabaseCIDR = "10.20.0.0/16"
		}
		spec := serverPod(t, p)
		for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
			if c.Name == "callout" {
				continue // compass-callout, run with its env by TestRenderedTopologiesAcceptMintedTokensAtBothDoors
			}
			if len(c.Args) != 1 {
				t.Fatalf("%s: args %v, want one subcommand", c.Name, c.Args)
			}
			reads := commandEnv(t, c.Args[0])
			for _, e := range c.Env {
				if e.Name == "COMPASS_POD_IP" {
					if !strings.Contains(envValue(c, "COMPASS_METRICS_ADDR"), "$(COMPASS_POD_IP)") {
						t.Errorf("%s: COMPASS_POD_IP is set but not used", c.Name)
					}
					continue
				}
				if !reads[e.Name] {
					t.Errorf("database secret %q: container %s sets %s, which compass-server %s does not read", secret, c.Name, e.Name, c.Args[0])
				}
			}
		}
	}
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestServerManifestsCommandFlags: compass-server manifests takes the Server
// flags from the command line and from COMPASS_* variables (internal/wiring/cli),
// and a refused combination is a usage error (exit 2) that says why.
func TestServerManifestsCommandFlags(t *testing.T) {
	env := map[string]string{
		"COMPASS_CLUSTER_NAME": "prod", "COMPASS_SERVER_URL": "https://compass.example.com:8443",
		"COMPASS_SERVER_IMAGE": "ghcr.io/compass-runner/compass-server:v0.1.0", "COMPASS_NETWORK_POLICIES": "false",
	}
	getenv := func(k string) string { return env[k] }
	var stdout, stderr bytes.Buffer
	if code := cli.Run(t.Context(), commands.Server, []string{"manifests", "--server-storage", "2Gi"}, getenv, &stdout, &stderr); code != 0 {
		t.Fatalf("manifests exited %d: %s", code, stderr.String())
	}
	p := deploy.DefaultParams()
	p.ServerImage, p.NetworkPolicies, p.ServerStorage = env["COMPASS_SERVER_IMAGE"], false, "2Gi"
	want, err := deploy.Render(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdout.Bytes(), want) {
		t.Fatal("compass-server manifests differs from rendering the same parameters")
	}
	stdout.Reset()
	stderr.Reset()
	env["COMPASS_SERVER_REPLICAS"] = "2"
	if code := cli.Run(t.Context(), commands.Server, []string{"manifests"}, getenv, &stdout, &stderr); code != 2 || stdout.Len() != 0 ||
		!strings.Contains(stderr.String(), "deploy: invalid parameters: server replicas: 2 with SQLite") {
		t.Fatalf("2 replicas on SQLite: exit %d, stdout %d bytes, stderr %q", code, stdout.Len(), stderr.String())
	}
}
