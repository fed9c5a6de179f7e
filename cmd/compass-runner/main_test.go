package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/runner"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfigFlagsThenEnv(t *testing.T) {
	cfg, err := parseConfig([]string{"--server", "https://flag:8443", "--mount", "/a:/b", "--mount", "/c:/d"}, env(map[string]string{
		"COMPASS_SERVER_URL":        "https://env:8443",
		"COMPASS_RUNNER_TOKEN_FILE": "/var/run/secrets/compass/runner/token",
		"COMPASS_NATS_URL":          "nats://env:4222",
		"COMPASS_HEARTBEAT":         "5s",
		"COMPASS_MOUNTS":            "/ignored:/x",
		"COMPASS_RUNNER_TOKEN":      "minted",
	}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server != "https://flag:8443" || cfg.TokenFile != "/var/run/secrets/compass/runner/token" || cfg.NATSURL != "nats://env:4222" ||
		cfg.Heartbeat != 5*time.Second || strings.Join(cfg.Mounts, " ") != "/a:/b /c:/d" || cfg.Token != "minted" ||
		cfg.HealthAddr != ":8081" {
		t.Fatalf("cfg = %+v", cfg)
	}
	cfg, err = parseConfig(nil, env(map[string]string{"COMPASS_MOUNTS": "/a:/b,/c:/d"}), &bytes.Buffer{})
	if err != nil || strings.Join(cfg.Mounts, " ") != "/a:/b /c:/d" {
		t.Fatalf("env mounts: %v %v", cfg.Mounts, err)
	}
	if _, err := parseConfig(nil, env(map[string]string{"COMPASS_HEARTBEAT": "soon"}), &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "COMPASS_HEARTBEAT") {
		t.Fatalf("bad env value: err = %v", err)
	}
	var help bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, env(nil), &help); !errors.Is(err, errHelp) || !strings.Contains(help.String(), "COMPASS_RUNNER_TOKEN_FILE") {
		t.Fatalf("--help: err %v, output:\n%s", err, help.String())
	}
}

func TestBothTokenSourcesFailAtStartCommand(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseConfig([]string{"--token-file", path, "--nats-url", "nats://127.0.0.1:1", "--runner-id", "r1", "--health-addr", ""},
		env(map[string]string{"COMPASS_RUNNER_TOKEN": "minted-secret"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if !errors.Is(err, runner.ErrBothTokens) || strings.Contains(err.Error(), "minted-secret") {
		t.Fatalf("err = %v, want ErrBothTokens without the token", err)
	}
}

func TestStartRefusals(t *testing.T) {
	dir := t.TempDir()
	tokenDir := filepath.Join(dir, "secrets")
	if err := os.Mkdir(tokenDir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(tokenDir, "token")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want error
		msg  string
	}{
		{"mount over the token directory", []string{"--token-file", path, "--runner-id", "r1", "--nats-url", "nats://127.0.0.1:1", "--mount", tokenDir + ":/mnt"}, nil, runner.ErrMountOverToken, ""},
		{"mount of an ancestor", []string{"--token-file", path, "--runner-id", "r1", "--nats-url", "nats://127.0.0.1:1", "--mount", dir + ":/mnt"}, nil, runner.ErrMountOverToken, ""},
		{"relative mount", []string{"--token-file", path, "--runner-id", "r1", "--nats-url", "nats://127.0.0.1:1", "--mount", "data:/mnt"}, nil, runner.ErrBadMount, ""},
		{"no token", []string{"--runner-id", "r1", "--nats-url", "nats://127.0.0.1:1"}, nil, runner.ErrNoToken, ""},
		{"no server and no NATS URL", []string{"--token-file", path, "--runner-id", "r1"}, nil, nil, "set --server"},
		{"plaintext server", []string{"--token-file", path, "--server", "http://server:8443"}, nil, nil, "must be https://"},
		{"static token without runner ID", []string{"--nats-url", "nats://127.0.0.1:1"}, map[string]string{"COMPASS_RUNNER_TOKEN": "minted"}, nil, "--runner-id is required"},
		{"invalid runner ID", []string{"--token-file", path, "--runner-id", "a.b", "--nats-url", "nats://127.0.0.1:1"}, nil, nil, "--runner-id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseConfig(append(tc.args, "--health-addr", ""), env(tc.env), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			err = run(context.Background(), cfg, slog.New(slog.DiscardHandler))
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v / %q", err, tc.want, tc.msg)
			}
		})
	}
}
