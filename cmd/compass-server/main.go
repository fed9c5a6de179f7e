// Command compass-server is the Compass Server: the gRPC door Runners enroll
// through, the token and Runner store, the operator CLI and a one-process dev
// stack. See "compass-server --help" and docs/server.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/compass-runner/identity/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := server.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
