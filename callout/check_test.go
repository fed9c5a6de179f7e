package callout_test

import (
	"errors"
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
)

// ServeConfig.Check refuses each setting that cannot work with an error
// naming its flag, at the boundaries of every number, and takes the settings
// just inside them.
func TestServeConfigCheck(t *testing.T) {
	ok := func() callout.ServeConfig {
		return callout.ServeConfig{Mode: callout.ModeServerConfig, IssuerSeedFile: "i", Account: "RUNNERS", RunnerClusters: "c", KickUser: "k", KickPassword: "p"}
	}
	with := func(f func(*callout.ServeConfig)) callout.ServeConfig {
		c := ok()
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  callout.ServeConfig
		want string // "" : accepted
	}{
		{"minimal server-config", ok(), ""},
		{"database only", with(func(c *callout.ServeConfig) { c.RunnerClusters, c.DatabaseURL = "", "sqlite://x" }), ""},
		{"creds and nkey", with(func(c *callout.ServeConfig) { c.NATSCreds, c.NATSNkeyFile = "a", "b" }), "set one of --nats-creds, --nats-nkey and --nats-user"},
		{"nkey and user", with(func(c *callout.ServeConfig) { c.NATSNkeyFile, c.NATSUser, c.NATSPassword = "b", "u", "p" }), "set one of --nats-creds, --nats-nkey and --nats-user"},
		{"creds alone", with(func(c *callout.ServeConfig) { c.NATSCreds = "a" }), ""},
		{"user and password", with(func(c *callout.ServeConfig) { c.NATSUser, c.NATSPassword = "u", "p" }), ""},
		{"user without password", with(func(c *callout.ServeConfig) { c.NATSUser = "u" }), "--nats-user needs --nats-password-file or COMPASS_NATS_PASSWORD"},
		{"password without user", with(func(c *callout.ServeConfig) { c.NATSPassword = "p" }), ""},
		{"no issuer seed", with(func(c *callout.ServeConfig) { c.IssuerSeedFile = "" }), "--issuer-seed-file is required"},
		{"server-config without account", with(func(c *callout.ServeConfig) { c.Account = "" }), "--account (the Runners' account name) is required in server-config mode"},
		{"operator without user signer", with(func(c *callout.ServeConfig) { c.Mode = callout.ModeOperator }), "--user-signing-seed-file is required in operator mode"},
		{"operator with user signer, no account", with(func(c *callout.ServeConfig) { c.Mode, c.UserSeedFile, c.Account = callout.ModeOperator, "u", "" }), ""},
		{"server-config with a user signer", with(func(c *callout.ServeConfig) { c.UserSeedFile = "u" }), "--user-signing-seed-file and --callout-account are operator-mode flags"},
		{"server-config with a callout account", with(func(c *callout.ServeConfig) { c.CalloutAccount = "A" }), "--user-signing-seed-file and --callout-account are operator-mode flags"},
		{"unknown mode", with(func(c *callout.ServeConfig) { c.Mode = callout.Mode(7); c.UserSeedFile = "u" }), "unknown mode 7"},
		{"connections -1", with(func(c *callout.ServeConfig) { c.Connections = -1 }), "--connections -1: want 1 to 64"},
		{"connections 0 (the default)", with(func(c *callout.ServeConfig) { c.Connections = 0 }), ""},
		{"connections at the maximum", with(func(c *callout.ServeConfig) { c.Connections = callout.MaxConnections }), ""},
		{"connections past the maximum", with(func(c *callout.ServeConfig) { c.Connections = callout.MaxConnections + 1 }), "--connections 65: want 1 to 64"},
		{"workers -1", with(func(c *callout.ServeConfig) { c.Workers = -1 }), "--workers -1: want at least 1"},
		{"workers 0 (the default)", with(func(c *callout.ServeConfig) { c.Workers = 0 }), ""},
		{"horizon just below the floor", with(func(c *callout.ServeConfig) { c.AnswerHorizon = callout.MinAnswerHorizon - time.Millisecond }), "--answer-horizon 99ms: want at least 100ms"},
		{"horizon at the floor", with(func(c *callout.ServeConfig) { c.AnswerHorizon = callout.MinAnswerHorizon }), ""},
		{"horizon 0 (the default)", with(func(c *callout.ServeConfig) { c.AnswerHorizon = 0 }), ""},
		{"nothing to accept", with(func(c *callout.ServeConfig) { c.RunnerClusters = "" }), "nothing to accept: set --runner-clusters, --database-url or both"},
		{"no kick identity", with(func(c *callout.ServeConfig) { c.KickUser, c.KickPassword = "", "" }), "no kick identity: set --kick-creds, --kick-nkey or --kick-user (a NATS system-account user allowed the servers' CONNZ and KICK requests), or --no-kick to let revoked Runners stay connected until their user JWTs expire"},
		{"no kick identity, --no-kick", with(func(c *callout.ServeConfig) { c.KickUser, c.KickPassword, c.NoKick = "", "", true }), ""},
		{"kick identity and --no-kick", with(func(c *callout.ServeConfig) { c.NoKick = true }), "--no-kick and a kick identity (--kick-creds, --kick-nkey, --kick-user) contradict each other"},
		{"kick creds alone", with(func(c *callout.ServeConfig) { c.KickUser, c.KickPassword, c.KickCreds = "", "", "k.creds" }), ""},
		{"kick nkey alone", with(func(c *callout.ServeConfig) { c.KickUser, c.KickPassword, c.KickNkeyFile = "", "", "k.nk" }), ""},
		{"two kick identities", with(func(c *callout.ServeConfig) { c.KickCreds = "k.creds" }), "set one of --kick-creds, --kick-nkey and --kick-user"},
		{"kick user without password", with(func(c *callout.ServeConfig) { c.KickPassword = "" }), "--kick-user needs --kick-password-file or COMPASS_KICK_PASSWORD"},
		{"duplicate grace below the floor", with(func(c *callout.ServeConfig) { c.DuplicateGrace = time.Second - time.Nanosecond }), "--duplicate-grace 999.999999ms: want at least 1s"},
		{"duplicate grace at the floor", with(func(c *callout.ServeConfig) { c.DuplicateGrace = time.Second }), ""},
		{"negative sweep interval", with(func(c *callout.ServeConfig) { c.SweepInterval = -time.Second }), "--sweep-interval -1s: want a positive duration"},
		{"negative listing interval", with(func(c *callout.ServeConfig) { c.ListInterval = -time.Second }), "--list-interval -1s: want a positive duration"},
		{"negative revocation poll", with(func(c *callout.ServeConfig) { c.RevocationPoll = -time.Second }), "--revocation-poll -1s: want a positive duration"},
		{"negative quarantine threshold", with(func(c *callout.ServeConfig) { c.QuarantineAfter = -1 }), "--quarantine-after -1: want 0 (off) or more"},
		{"quarantine window below the floor", with(func(c *callout.ServeConfig) { c.QuarantineWindow = 2*time.Second - time.Nanosecond }), "--quarantine-window 1.999999999s: want at least 2s"},
		{"user JWT lifetime at the maximum", with(func(c *callout.ServeConfig) { c.MaxUserLifetime = time.Hour }), ""},
		{"user JWT lifetime past the maximum", with(func(c *callout.ServeConfig) { c.MaxUserLifetime = time.Hour + time.Second }), "--max-user-jwt-lifetime 1h0m1s: want 2s to 1h0m0s"},
		{"user JWT lifetime at the minimum", with(func(c *callout.ServeConfig) { c.MaxUserLifetime = 2 * time.Second }), ""},
		{"user JWT lifetime below the minimum", with(func(c *callout.ServeConfig) { c.MaxUserLifetime = time.Second }), "--max-user-jwt-lifetime 1s: want 2s to 1h0m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Check()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v, want accepted", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want || !errors.Is(err, callout.ErrConfig)):
				t.Fatalf("Check: %v, want callout.ErrConfig %q", err, tc.want)
			}
		})
	}
}
