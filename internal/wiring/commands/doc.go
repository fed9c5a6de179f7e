// Package commands defines the three daemons' command lines on internal/wiring/cli:
// their flags and environment, help, refusals and what each command runs.
// Each cmd/* main is one call to cli.Main with one of them:
//
//   - Server, compass-server: the program with serve, ping-runner and
//     manifests (server.go), the store commands (serverstore.go) and dev
//     (dev.go);
//   - Callout, compass-callout (callout.go);
//   - Runner, compass-runner (runner.go).
//
// The daemons' own logic is in their packages (server, internal/wiring/devstack,
// callout, runner); the lifecycle every command shares (signals, exit codes,
// the environment fallback, --help and --version) is internal/wiring/cli's.
package commands
