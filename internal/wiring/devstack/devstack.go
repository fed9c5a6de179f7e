// Package devstack is compass-server dev: the whole Compass stack in one
// process, on loopback, for trying it out. It runs an embedded nats-server
// whose authorization is the auth callout (server-config mode, xkey on), the
// callout and its kicker in-process on the door's resolver, the Server
// (package server) with a throwaway CA and SQLite, and a local issuer
// (package kubeissuer) registered as cluster "dev" that keeps a projected
// token fresh in a file as a kubelet does. Its messages keep compass-server's
// "server: dev:" prefix. serve, not this, is what is deployed.
package devstack

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/atomicfile"
	"github.com/compass-runner/identity/internal/lib/loopbackca"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/verifier"
)

// The dev stack's defaults.
const (
	DefaultListen     = "127.0.0.1:8443"
	DefaultNATSListen = "127.0.0.1:4222"
	// Cluster and Node name the dev issuer's cluster and the node its
	// projected token is for; the Runner's ID is therefore RunnerID.
	Cluster  = "dev"
	Node     = "dev-node"
	RunnerID = Cluster + "/" + Node
	// Account is the account of the dev admin token.
	Account = "dev-admin"
	// TokenLifetime is the projected token's lifetime: the Kubernetes
	// minimum, rewritten at 80 % as a kubelet does.
	TokenLifetime = 600 * time.Second
	// natsReady bounds the embedded nats-server's start.
	natsReady = 10 * time.Second
)

// Files dev mode writes in its data dir.
const (
	CAFile          = "ca.pem"
	RunnerTokenFile = "runner-token"
	AdminTokenFile  = "admin-token"
)

// Config configures Run.
type Config struct {
	DataDir    string
	Listen     string // door address
	NATSListen string // embedded nats-server address
	Logger     *slog.Logger
	// Out gets the instructions (stdout).
	Out io.Writer
	// After is the token file's rotation timer (nil: time.After).
	After func(time.Duration) <-chan time.Time
	// Ready, if set, is called once everything is up.
	Ready func(Info)
	// ServerVersion is what Enroll tells Runners (server.ServeConfig).
	ServerVersion string
}

// Info is where the dev stack is.
type Info struct {
	DoorURL         string
	NATSURL         string
	IssuerURL       string
	CAFile          string // the door's CA
	RunnerTokenFile string // projected token for Node, kept fresh
	AdminTokenFile  string // account token for the admin door
	RunnerID        string
}

// Run runs the whole stack in one process until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.DataDir == "" {
		cfg.DataDir = server.DefaultDataDir
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.NATSListen == "" {
		cfg.NATSListen = DefaultNATSListen
	}
	// Every fixed port and the data dir's lock first, before anything in
	// the data dir is touched: a second dev would otherwise rewrite the
	// first one's CA and tokens before failing to listen, or, on other
	// ports, run on beside it with its own CA in the first one's files.
	if err := checkCollisions(cfg); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("server: dev: data dir: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir)
	if errors.Is(err, errDataDirInUse) {
		// Another dev took it since the check (both started at once).
		return fmt.Errorf("server: dev: %s (nothing in %s was changed)", collision(cfg.DataDir, nil, nil, true, 0), cfg.DataDir)
	}
	if err != nil {
		return err
	}
	defer lock.Release()
	info := Info{
		CAFile:          filepath.Join(cfg.DataDir, CAFile),
		RunnerTokenFile: filepath.Join(cfg.DataDir, RunnerTokenFile),
		AdminTokenFile:  filepath.Join(cfg.DataDir, AdminTokenFile),
		RunnerID:        RunnerID,
	}

	// The door's TLS: a throwaway CA, written for clients.
	cert, caPEM, err := loopbackca.New(time.Now())
	if err != nil {
		return err
	}
	if err := atomicfile.Write(info.CAFile, caPEM); err != nil {
		return fmt.Errorf("server: dev: write CA: %w", err)
	}

	// The dev issuer, registered as cluster "dev".
	is, err := kubeissuer.New(kubeissuer.Options{})
	if err != nil {
		return fmt.Errorf("server: dev: %w", err)
	}
	defer is.Close()
	info.IssuerURL = is.URL()
	issuerCA, err := is.WriteCAFileIn(cfg.DataDir, "dev-issuer")
	if err != nil {
		return fmt.Errorf("server: dev: %w", err)
	}
	clusters := []verifier.RunnerCluster{{Name: Cluster, Issuer: is.URL(), CAFile: issuerCA}}

	// The embedded nats-server: authorization is the auth callout.
	ns, natsCreds, err := startDevNATS(cfg.NATSListen)
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	info.NATSURL = ns.ClientURL()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	// The kubelet's part: a projected token for dev-node, rewritten at 80 %.
	// The node and pod keep their UIDs across rewrites, as on a real node.
	pod := kubeissuer.Pod{NodeName: Node, NodeUID: "dev-node-uid", PodName: "compass-runner-dev-node", PodUID: "dev-pod-uid"}
	if _, err := is.WriteTokenFile(info.RunnerTokenFile, pod, TokenLifetime); err != nil {
		return fmt.Errorf("server: dev: %w", err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := is.RotateTokenFile(ctx, info.RunnerTokenFile, pod, TokenLifetime, cfg.After, func(exp time.Time, err error) {
			if err != nil {
				log.Error("server: dev: token file rewrite failed", "err", err)
				return
			}
			log.Debug("server: dev: token file rewritten", "path", info.RunnerTokenFile, "exp", exp)
		})
		if err != nil {
			log.Error("server: dev: token file rotation stopped", "err", err)
		}
	}()

	var co *callout.Responder
	defer func() {
		if co != nil {
			<-co.Done() // the callout drains once Serve's context ended
		}
	}()
	return server.Serve(ctx, server.ServeConfig{
		Listen:    cfg.Listen,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		Clusters:  clusters,
		DataDir:   cfg.DataDir,
		// dev's database is throwaway: an older dev's is migrated, where
		// serve would refuse it until an operator runs migrate.
		MigrateOnStart: true,
		NATS:           server.NATSConfig{URL: info.NATSURL, User: devServerUser, Password: natsCreds.server, Name: "compass-server"},
		Logger:         log,
		ServerVersion:  cfg.ServerVersion,
		Ready: func(ctx context.Context, si server.ServeInfo) error {
			info.DoorURL = "https://" + si.DoorAddr
			// Load the dev issuer's keys now, so the first Runner enrolls at once.
			if err := si.Verifier.Refresh(ctx); err != nil {
				return fmt.Errorf("dev: load the dev issuer's keys: %w", err)
			}
			r, err := startDevCallout(ctx, info.NATSURL, natsCreds, si, log, &wg)
			if err != nil {
				return err
			}
			co = r // read after Serve returns, which waits for Ready
			if err := devAdminToken(ctx, si, info.AdminTokenFile); err != nil {
				return err
			}
			printDev(cfg.Out, info)
			if cfg.Ready != nil {
				cfg.Ready(info)
			}
			return nil
		},
	})
}

// devAdminToken keeps an account token for the admin door in path: the one
// already there if it still resolves, else a new one.
func devAdminToken(ctx context.Context, si server.ServeInfo, path string) error {
	if old, err := readSecretFile(path); err == nil {
		if _, err := si.Resolver.Resolve(ctx, old, verifier.SubjectAccount); err == nil {
			return nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("dev: %w", err)
	}
	tok, _, err := si.Store.Mint(ctx, verifier.SubjectAccount, Account)
	if err != nil {
		return fmt.Errorf("dev: mint the admin token: %w", err)
	}
	if err := atomicfile.Write(path, []byte(tok+"\n")); err != nil {
		return fmt.Errorf("dev: write the admin token: %w", err)
	}
	return os.Chmod(path, 0o600)
}

// readSecretFile reads a token file, trimming the trailing newline.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("server: read secret file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func printDev(w io.Writer, i Info) {
	fmt.Fprintf(w, `compass-server dev: the whole stack is up on loopback.

  door (gRPC, TLS)  %s   CA: %s
  nats              %s   (auth callout, xkey on)
  dev issuer        %s   cluster %q, node %q
  runner token      %s   (projected token, rewritten every %s)
  admin token       %s   (account %q)

Start a Runner in another terminal:

  %s

Then ping it:

  %s

`, i.DoorURL, i.CAFile, i.NATSURL, i.IssuerURL, Cluster, Node,
		i.RunnerTokenFile, TokenLifetime*8/10, i.AdminTokenFile, Account,
		RunnerCommand(i), PingCommand(i))
}

// RunnerCommand is the compass-runner command dev mode prints.
func RunnerCommand(i Info) string {
	return fmt.Sprintf("compass-runner --server %s --ca-file %s --token-file %s", i.DoorURL, i.CAFile, i.RunnerTokenFile)
}

// PingCommand is the ping-runner command dev mode prints.
func PingCommand(i Info) string {
	return fmt.Sprintf("compass-server ping-runner --server %s --ca-file %s --token-file %s %s", i.DoorURL, i.CAFile, i.AdminTokenFile, i.RunnerID)
}
