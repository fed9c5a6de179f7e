package commands_test

import (
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/runner"
)

// DL-316.3 fixes the kicker's numbers: a duplicate grace of 12 s, longer
// than the Runner's own handover drain (runner.DrainTimeout, 10 s) so that a
// handover is never taken for a copied token, and a safety-net sweep every
// 30 s. compass-callout's --help gives them as its defaults, which is what
// an unset flag runs with.
func TestCalloutKickDefaultsAreTheRecords(t *testing.T) {
	if kick.DefaultDuplicateGrace != 12*time.Second {
		t.Errorf("kick.DefaultDuplicateGrace = %s, DL-316.3's is 12s", kick.DefaultDuplicateGrace)
	}
	if kick.DefaultDuplicateGrace <= runner.DrainTimeout {
		t.Errorf("the duplicate grace %s does not exceed the Runner's drain %s: a handover would be taken for a copy", kick.DefaultDuplicateGrace, runner.DrainTimeout)
	}
	if kick.DefaultSweepInterval != 30*time.Second {
		t.Errorf("kick.DefaultSweepInterval = %s, DL-316.3's is 30s", kick.DefaultSweepInterval)
	}
	code, help, _ := run(t, commands.Callout, nil, "--help")
	if code != cli.ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	for flag, want := range map[string]string{"duplicate-grace": `(default "12s")`, "sweep-interval": `(default "30s")`,
		"list-interval": `(default "5m0s")`, "quarantine-after": `(default "3")`, "quarantine-window": `(default "10m0s")`} {
		if entry := flagHelpEntry(t, help, flag); !strings.Contains(entry, want) {
			t.Errorf("--help's --%s does not say %s:\n%s", flag, want, entry)
		}
	}
}
