package deploy_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/deploytest"
	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

// A rotation of the callout's keys is a helm upgrade with values, in both
// layouts (docs/self-host.md, "Rotating the callout's keys"): with
// callout.nextXKey (nextIssuer) the callout container gets key next-seed of
// Secret compass-callout-xkey (compass-callout-signing), projected read-only
// beside seed, and COMPASS_NEXT_XKEY_SEED_FILE (COMPASS_NEXT_ISSUER_SEED_FILE)
// pointing at it, which compass-callout reads as --next-xkey-seed-file
// (--next-issuer-seed-file); without them, neither the file nor the
// variable. Nothing is left for kubectl patch.
func TestRender_CalloutNextKeysByValues(t *testing.T) {
	layouts := []struct {
		name           string
		params         func() deploy.Params
		kind, workload string
	}{
		{"callout Deployment (PostgreSQL)", func() deploy.Params {
			p := deploy.DefaultParams()
			p.ServerImage, p.ServerDatabaseSecret, p.DatabaseCIDR = "ghcr.io/compass-runner/compass-server:v0.1.0", "compass-server-database", "10.20.0.0/16"
			return p
		}, "Deployment", "compass-callout"},
		{"callout in the Server's pod (SQLite)", func() deploy.Params {
			p := deploy.DefaultParams()
			p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
			return p
		}, "StatefulSet", "compass-server"},
	}
	roles := []struct {
		value, secret, env, flag string
	}{
		{"nextXKey", "compass-callout-xkey", "COMPASS_NEXT_XKEY_SEED_FILE", "next-xkey-seed-file"},
		{"nextIssuer", "compass-callout-signing", "COMPASS_NEXT_ISSUER_SEED_FILE", "next-issuer-seed-file"},
	}
	for _, l := range layouts {
		for _, set := range []map[string]bool{{}, {"nextXKey": true}, {"nextIssuer": true}, {"nextXKey": true, "nextIssuer": true}} {
			callout := map[string]any{}
			for k, v := range set {
				callout[k] = v
			}
			t.Run(l.name+" "+fmtSet(set), func(t *testing.T) {
				spec := deploytest.RenderedPodValues(t, l.params(), map[string]any{"callout": callout}, l.kind, l.workload)
				c := container(t, spec, "callout")
				env := plainEnv(c)
				fs, err := cli.Parse(commands.Callout, commands.Callout, nil, func(k string) string { return env[k] })
				if err != nil {
					t.Fatalf("compass-callout with the rendered environment: %v", err)
				}
				for _, r := range roles {
					file := projectedFile(spec, c, r.secret, "next-seed")
					got := fs.Lookup(r.flag).Value.String()
					if !set[r.value] {
						if file != "" || env[r.env] != "" || got != "" {
							t.Fatalf("%s unset, yet next-seed at %q, %s=%q, --%s=%q", r.value, file, r.env, env[r.env], r.flag, got)
						}
						continue
					}
					if file == "" || env[r.env] != file || got != file {
						t.Fatalf("%s: next-seed of %s projected at %q, %s=%q, --%s=%q; want all three the same file",
							r.value, r.secret, file, r.env, env[r.env], r.flag, got)
					}
					if cur := projectedFile(spec, c, r.secret, "seed"); cur == "" || cur == file {
						t.Fatalf("%s: the current seed of %s at %q beside the next at %q", r.value, r.secret, cur, file)
					}
				}
			})
		}
	}
}

// plainEnv is c's environment variables with a literal value.
func plainEnv(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	return env
}

func fmtSet(set map[string]bool) string {
	switch {
	case set["nextXKey"] && set["nextIssuer"]:
		return "both next keys"
	case set["nextXKey"]:
		return "next xkey"
	case set["nextIssuer"]:
		return "next issuer"
	}
	return "no next key"
}
