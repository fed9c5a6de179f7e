//go:build linux

package fleet

// The fleet's Runners, cheaply: one raw TCP connection each, speaking just
// enough of the NATS client protocol to be a Runner the callout authorized
// (INFO, CONNECT with the Runner's token, PING/PONG, a SUB on its command
// subject) and to stay connected (every server PING answered). A connection
// the server closes is seen as EOF by serve.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// handshakeTimeout bounds one connection's INFO, CONNECT and SUB; a server
// with the callout answering takes milliseconds, a storm on two cores may
// take seconds (nats-server's own authorization timeout is 2 s).
const handshakeTimeout = 15 * time.Second

// rawConn is one Runner's connection. After dialRunner, only serve reads and
// writes it.
type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

// connectMsg is the CONNECT a nats.go Runner sends, less what does not
// matter to the server here.
type connectMsg struct {
	Verbose      bool   `json:"verbose"`
	Pedantic     bool   `json:"pedantic"`
	AuthToken    string `json:"auth_token"`
	Name         string `json:"name"`
	Lang         string `json:"lang"`
	Version      string `json:"version"`
	Protocol     int    `json:"protocol"`
	Headers      bool   `json:"headers"`
	NoResponders bool   `json:"no_responders"`
}

// dialRunner connects to addr as the Runner whose token is token and
// subscribes to subject (its command subject, in the Runners' queue group),
// returning once the server confirmed both. Its errors never hold the token.
func dialRunner(d *net.Dialer, addr, token, subject string) (*rawConn, error) {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	rc := &rawConn{c: c, r: bufio.NewReaderSize(c, 2048)}
	if err := rc.handshake(token, subject); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	return rc, nil
}

func (rc *rawConn) handshake(token, subject string) error {
	if err := rc.c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return err
	}
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading INFO: %w", err)
	}
	if !strings.HasPrefix(line, "INFO ") {
		return fmt.Errorf("first line is not INFO: %.40q", line)
	}
	msg, err := json.Marshal(connectMsg{AuthToken: token, Name: "fleet-runner", Lang: "raw", Version: "0", Protocol: 1, Headers: true, NoResponders: true})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(rc.c, "CONNECT %s\r\nPING\r\n", msg); err != nil {
		return fmt.Errorf("writing CONNECT: %w", err)
	}
	if err := rc.awaitPong("CONNECT"); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(rc.c, "SUB %s runner 1\r\nPING\r\n", subject); err != nil {
		return fmt.Errorf("writing SUB: %w", err)
	}
	if err := rc.awaitPong("SUB"); err != nil {
		return err
	}
	return rc.c.SetDeadline(time.Time{})
}

// awaitPong reads until the server's PONG, answering its PINGs; -ERR (an
// authorization violation or timeout, a permissions violation) is the
// error.
func (rc *rawConn) awaitPong(after string) error {
	for {
		line, err := rc.r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("awaiting PONG after %s: %w", after, err)
		}
		switch {
		case strings.HasPrefix(line, "PONG"):
			return nil
		case strings.HasPrefix(line, "PING"):
			if _, err := rc.c.Write([]byte("PONG\r\n")); err != nil {
				return err
			}
		case strings.HasPrefix(line, "-ERR"):
			return fmt.Errorf("server after %s: %s", after, strings.TrimSpace(line))
		}
	}
}

// serve answers the server's PINGs until the connection ends and returns
// why: io.EOF when the server closed it (a kick), net.ErrClosed when close
// did.
func (rc *rawConn) serve() error {
	for {
		line, err := rc.r.ReadString('\n')
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(line, "PING"):
			if _, err := rc.c.Write([]byte("PONG\r\n")); err != nil {
				return err
			}
		case strings.HasPrefix(line, "MSG ") || strings.HasPrefix(line, "HMSG "):
			// Nobody sends the fleet commands; skip the payload all the same.
			f := strings.Fields(line)
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				return fmt.Errorf("bad %s line: %w", f[0], err)
			}
			if _, err := rc.r.Discard(n + 2); err != nil {
				return err
			}
		}
	}
}

func (rc *rawConn) close() { _ = rc.c.Close() }

// closedByServer reports whether serve's error is the server ending the
// connection rather than this side closing it.
func closedByServer(err error) bool { return !errors.Is(err, net.ErrClosed) }
