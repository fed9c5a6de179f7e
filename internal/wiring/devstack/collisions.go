package devstack

// Before anything starts: a secret for a dev user, the NATS listen address,
// and a refusal, naming the flag to change, when another dev stack already
// holds a port or the directory.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
)

func randomSecret() (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("server: dev: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// natsListen turns host:port into nats-server's listen value (port 0 is -1:
// a random port).
func natsListen(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("server: dev: --nats-listen %q: %w", addr, err)
	}
	if port == "0" {
		port = "-1"
	} else if _, err := strconv.Atoi(port); err != nil {
		return "", fmt.Errorf("server: dev: --nats-listen %q: bad port", addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// devPort is one address dev listens on, with the flag that moves it.
type devPort struct {
	what, addr, flag string
}

// checkCollisions finds, before dev writes anything, what another dev
// already holds: each address dev listens on at a fixed port (the door's and
// the embedded nats-server's; the dev issuer's port is random), bound and
// released at once, and the data dir's lock (probed without creating it).
// Its error names every flag that must change. The port check is a check,
// not a reservation: a port taken between the check and the real listen
// still fails dev, later and with the listener's error; the data dir is
// reserved by lockDataDir, which Run takes next.
func checkCollisions(cfg Config) error {
	nl, err := natsListen(cfg.NATSListen)
	if err != nil {
		return err
	}
	var taken, flags, other []string
	for _, p := range []devPort{
		{"the door's address", cfg.Listen, "--listen"},
		{"the NATS address", nl, "--nats-listen"},
	} {
		_, port, err := net.SplitHostPort(p.addr)
		if err != nil {
			return fmt.Errorf("server: dev: %s %q (%s): %w", p.what, p.addr, p.flag, err)
		}
		if port == "0" || port == "-1" {
			continue // a random port is never taken
		}
		ln, err := net.Listen("tcp", p.addr)
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			taken = append(taken, fmt.Sprintf("%s %s (%s)", p.what, p.addr, p.flag))
			flags = append(flags, p.flag)
		case err != nil:
			other = append(other, fmt.Sprintf("cannot listen on %s %s (%s): %v", p.what, p.addr, p.flag, err))
		default:
			if err := ln.Close(); err != nil {
				return fmt.Errorf("server: dev: release %s: %w", p.addr, err)
			}
		}
	}
	held, pid, err := probeDataDirLock(cfg.DataDir)
	if err != nil {
		return err
	}
	var msgs []string
	if len(taken) > 0 || held {
		msgs = append(msgs, collision(cfg.DataDir, taken, flags, held, pid))
	}
	msgs = append(msgs, other...)
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("server: dev: %s (nothing in %s was changed)", strings.Join(msgs, "; "), cfg.DataDir)
}

// collision says what another dev holds and every flag that must change
// for this one to run beside it. Ports alone: the data dir is free (no dev
// holds its lock), and the message says it may stay, so that no one moves
// the ports and keeps a data dir in use, or moves a data dir for nothing.
func collision(dir string, taken, flags []string, held bool, pid int) string {
	holder := "another compass-server dev"
	if pid > 0 {
		holder += fmt.Sprintf(" (pid %d)", pid)
	}
	inUse := fmt.Sprintf("the data dir %s (--data-dir) is in use by %s", dir, holder)
	switch {
	case len(taken) == 0:
		return fmt.Sprintf("%s: stop it or give this one its own --data-dir", inUse)
	case !held:
		verb := "is"
		if len(taken) > 1 {
			verb = "are"
		}
		return fmt.Sprintf("%s %s taken: another compass-server dev may be running; stop it or move this one with %s; its --data-dir may stay, as no other dev holds it",
			strings.Join(taken, " and "), verb, strings.Join(flags, " and "))
	default:
		verb := "is"
		if len(taken) > 1 {
			verb = "are"
		}
		return fmt.Sprintf("%s %s taken and %s: stop it or give this one its own %s",
			strings.Join(taken, " and "), verb, inUse, joinFlags(append(flags, "--data-dir")))
	}
}

// joinFlags lists flags as "a, b and c".
func joinFlags(f []string) string {
	if len(f) == 1 {
		return f[0]
	}
	return strings.Join(f[:len(f)-1], ", ") + " and " + f[len(f)-1]
}
