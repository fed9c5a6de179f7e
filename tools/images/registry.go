package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

// serveRegistry serves an in-memory registry with the referrers API on a
// loopback address until ctx ends, calling ready with the address it bound
// to once it accepts connections. It is for the release procedure's dry
// run: the same push, to a registry that exists only for the run.
func serveRegistry(ctx context.Context, listen string, ready func(addr string) error) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return usageError{fmt.Sprintf("--listen %q: %v", listen, err)}
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		// Plain HTTP and no authentication: never reachable from another host.
		return usageError{fmt.Sprintf("--listen %q is not a loopback address", listen)}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	srv := &http.Server{
		Handler:           registry.New(registry.WithReferrersSupport(true), registry.Logger(log.New(io.Discard, "", 0))),
		ReadHeaderTimeout: 10 * time.Second,
	}
	if err := ready(ln.Addr().String()); err != nil {
		_ = ln.Close()
		return fmt.Errorf("registry: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("registry: %w", err)
	}
}

func runRegistry(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("registry", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "loopback address to serve on (port 0: any free port)")
	addrFile := fs.String("addr-file", "", "write the bound address to this file once serving")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveRegistry(ctx, *listen, func(addr string) error {
		fmt.Fprintf(stdout, "registry on %s\n", addr)
		if *addrFile == "" {
			return nil
		}
		return os.WriteFile(*addrFile, []byte(addr+"\n"), 0o644)
	})
}
