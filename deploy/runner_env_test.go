package deploy_test

import (
	"flag"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

// runnerContainer renders p and returns the DaemonSet's runner container.
func runnerContainer(t *testing.T, p deploy.Params) corev1.Container {
	t.Helper()
	for _, c := range renderedPod(t, p, "DaemonSet", deploy.RunnerDaemonSet).Containers {
		if c.Name == "runner" {
			return c
		}
	}
	t.Fatal("the Runner DaemonSet has no runner container")
	return corev1.Container{}
}

// TestRender_RunnerEnvIsWhatTheRunnerReads: every variable the rendered
// DaemonSet sets for compass-runner is one it reads, under the name that
// wins for its flag (the design record's where it fixes one: DL-440's
// COMPASS_RUNNER_TOKEN_FILE), and compass-runner parsing that environment
// gets the projected token's path as --token-file.
func TestRender_RunnerEnvIsWhatTheRunnerReads(t *testing.T) {
	p := deploy.DefaultParams()
	p.CABundleConfigMap = "compass-ca"
	c := runnerContainer(t, p)

	cmd := commands.Runner
	wins := map[string]string{} // variable -> its flag, for the name that wins
	reads := map[string]string{}
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	cmd.Flags(fs)
	fs.VisitAll(func(f *flag.Flag) {
		names := cmd.EnvNames(f.Name)
		wins[names[0]] = f.Name
		for _, n := range names {
			reads[n] = f.Name
		}
	})
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.Name == "COMPASS_POD_IP" { // the pod's own, expanded into COMPASS_HEALTH_ADDR
			env[e.Name] = "10.0.0.7"
			continue
		}
		flagName, ok := reads[e.Name]
		if !ok {
			t.Errorf("the DaemonSet sets %s, which compass-runner does not read", e.Name)
			continue
		}
		if _, ok := wins[e.Name]; !ok {
			t.Errorf("the DaemonSet sets %s; --%s's variable is %s", e.Name, flagName, cmd.EnvNames(flagName)[0])
		}
	}
	got, err := cli.Parse(cmd, cmd, nil, func(k string) string {
		return strings.ReplaceAll(env[k], "$(COMPASS_POD_IP)", env["COMPASS_POD_IP"])
	})
	if err != nil {
		t.Fatalf("compass-runner with the DaemonSet's environment: %v", err)
	}
	var mount string
	for _, m := range c.VolumeMounts {
		if m.Name == "compass-runner-token" {
			mount = m.MountPath
		}
	}
	if tf := got.Lookup("token-file").Value.String(); mount == "" || tf != mount+"/token" {
		t.Fatalf("--token-file from the DaemonSet's environment = %q, want the projected token in %q", tf, mount)
	}
}
