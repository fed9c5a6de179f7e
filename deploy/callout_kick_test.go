package deploy_test

import (
	"bytes"
	"flag"
	"path"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

// calloutPod renders p and returns the callout Deployment's pod spec.
func calloutPod(t *testing.T, p deploy.Params) corev1.PodSpec {
	t.Helper()
	return renderedPod(t, p, "Deployment", "compass-callout")
}

// projectedFile is the file a container of spec sees for key of Secret
// secret, through a projected volume: its path, or "" when none projects it.
func projectedFile(spec corev1.PodSpec, c corev1.Container, secret, key string) string {
	for _, v := range spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.Secret == nil || s.Secret.Name != secret || (s.Secret.Optional != nil && *s.Secret.Optional) {
				continue
			}
			for _, it := range s.Secret.Items {
				if it.Key != key {
					continue
				}
				for _, m := range c.VolumeMounts {
					if m.Name == v.Name && m.ReadOnly && m.SubPath == "" {
						return path.Join(m.MountPath, it.Path)
					}
				}
			}
		}
	}
	return ""
}

// The rendered callout Deployment gives compass-callout its kick identity,
// so that it starts (it refuses to without one or --no-kick) and ends a
// revoked Runner's live connections: COMPASS_KICK_USER is compass-kick,
// the system account's user in the rendered NATS configuration, and
// COMPASS_KICK_PASSWORD_FILE is key kick-password of Secret
// compass-callout-nats, projected read-only, required, where the variable
// points. compass-callout parsing the Deployment's environment gets
// --kick-user compass-kick and that file as --kick-password-file, and not
// --no-kick; no secret is a literal in the environment.
func TestRender_CalloutHasTheKickIdentity(t *testing.T) {
	p := deploy.DefaultParams()
	spec := calloutPod(t, p)
	c := spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			continue // COMPASS_POD_IP, the optional database URL: not the kick identity's
		}
		env[e.Name] = e.Value
	}
	if env["COMPASS_KICK_USER"] != "compass-kick" {
		t.Fatalf("COMPASS_KICK_USER = %q, want compass-kick", env["COMPASS_KICK_USER"])
	}
	if _, ok := env["COMPASS_KICK_PASSWORD"]; ok {
		t.Fatal("the kick password is a literal in the Deployment's environment")
	}
	file := projectedFile(spec, c, "compass-callout-nats", "kick-password")
	if file == "" || env["COMPASS_KICK_PASSWORD_FILE"] != file {
		t.Fatalf("COMPASS_KICK_PASSWORD_FILE = %q; Secret compass-callout-nats key kick-password is projected at %q", env["COMPASS_KICK_PASSWORD_FILE"], file)
	}
	if natsPassword := projectedFile(spec, c, "compass-callout-nats", "password"); natsPassword == file || natsPassword != env["COMPASS_NATS_PASSWORD_FILE"] {
		t.Fatalf("the callout's own NATS password is at %q, COMPASS_NATS_PASSWORD_FILE %q, the kick password at %q", natsPassword, env["COMPASS_NATS_PASSWORD_FILE"], file)
	}

	// compass-callout reads these variables under these names.
	cmd := commands.Callout
	fs, err := cli.Parse(cmd, cmd, nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("compass-callout with the Deployment's environment: %v", err)
	}
	for flagName, want := range map[string]string{"kick-user": "compass-kick", "kick-password-file": file, "no-kick": "false", "kick-creds": "", "kick-nkey": ""} {
		if got := fs.Lookup(flagName); got == nil || got.Value.String() != want {
			t.Fatalf("--%s from the Deployment's environment = %v, want %q", flagName, got, want)
		}
	}
	reads := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { reads[cli.EnvName(f.Name)] = true })
	for _, e := range cmd.Env {
		reads[e.Name] = true
	}
	for name := range env {
		if strings.HasPrefix(name, "COMPASS_KICK") && !reads[name] {
			t.Errorf("the Deployment sets %s, which compass-callout does not read", name)
		}
	}

	// The user is the rendered configuration's system-account user.
	conf, err := deploy.RenderNATSConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(conf, []byte(`user: "compass-kick", password: $COMPASS_KICK_NATS_PASSWORD`)) {
		t.Fatal("the rendered NATS configuration has no user compass-kick with its password from the environment")
	}
}
