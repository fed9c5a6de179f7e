package kick

// Listing and kicking: the NATS system-account requests the Kicker makes,
// $SYS.REQ.SERVER.PING.CONNZ (every server answers), $SYS.REQ.SERVER.<id>.CONNZ
// (one server, for further pages) and $SYS.REQ.SERVER.<id>.KICK.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Subjects of the NATS server's system-account API that the Kicker uses. Its
// NATS user needs publish permission on exactly these and subscribe
// permission on its reply inboxes (docs/self-host.md, "The kick identity").
const (
	SubjectConnzAll = "$SYS.REQ.SERVER.PING.CONNZ"
	subjectConnzOne = "$SYS.REQ.SERVER.%s.CONNZ"
	subjectKick     = "$SYS.REQ.SERVER.%s.KICK"
	// SubjectConnzOne and SubjectKick are the permission patterns of the
	// per-server requests.
	SubjectConnzOne = "$SYS.REQ.SERVER.*.CONNZ"
	SubjectKick     = "$SYS.REQ.SERVER.*.KICK"
)

// Limits of a listing, each with its reason.
const (
	// PageSize is the connections one CONNZ answer carries. nats-server
	// copies and sorts every connection of the account for each page it is
	// asked for and then cuts the page out, so a listing of n connections in
	// pages of p costs n/p sorts of n: at 1,024 a server of 100,000 took 98
	// pages and 36 s of its CPU per listing (docs/scale.md). At 16,384 it is
	// 7. A connection is about 450 bytes of JSON with the auth fields, so a
	// page is at most about 7 MB: nats-server sends a system response of any
	// size (max_payload bounds what clients publish; a route carries a
	// message of any size), and it stays well under the 64 MB a client may have
	// pending, the server's and nats.go's default.
	PageSize = 16384
	// RequestTimeout bounds one request to one server (a page, a kick): on a
	// healthy server both take milliseconds; a server that takes a second
	// is short of CPU, and the request is retried by the next sweep.
	RequestTimeout = time.Second
	// gatherQuiet ends a listing of every server once no further server has
	// answered for this long after the last one did (when the number of
	// servers is not known yet, or one of them is down). Servers on one
	// network answer within milliseconds of each other.
	gatherQuiet = 150 * time.Millisecond
	// maxServers bounds the answers one listing takes: no NATS cluster the
	// callout serves has more servers.
	maxServers = 256
)

// ErrNoServers is returned when no NATS server answered a listing.
var ErrNoServers = errors.New("kick: no NATS server answered the connection listing")

// ErrNotConnected is returned, wrapped with the connection's state and last
// error (a server's refusal of the kick identity, in its words), when the
// kick identity's connection is down: no listing is sent, and the sweep's
// failure names the cause rather than a silence.
var ErrNotConnected = errors.New("kick: the kick identity's NATS connection is down")

// notConnected is ErrNotConnected with nc's state and last error.
func notConnected(nc *nats.Conn) error {
	if err := nc.LastError(); err != nil {
		return fmt.Errorf("%w (%s; last error: %v)", ErrNotConnected, nc.Status(), err)
	}
	return fmt.Errorf("%w (%s)", ErrNotConnected, nc.Status())
}

// Conn is one live client connection in the Runners' account, as its NATS
// server reports it.
type Conn struct {
	ServerID   string
	ServerName string
	CID        uint64
	// User is the connection's user name. For a connection the callout
	// authorized it is the user JWT's name: the Runner ID.
	User string
	// Issuer is the key (or account name) that issued the connection's
	// user: it tells the callout's grants from other users of the account.
	Issuer string
	Addr   string // client host:port
	Start  time.Time
}

// key identifies a connection in a NATS cluster.
type key struct {
	server string
	cid    uint64
}

func (c Conn) key() key { return key{c.ServerID, c.CID} }

// apiResponse is the envelope of a system-account API answer.
type apiResponse struct {
	Server struct {
		Name string `json:"name"`
		ID   string `json:"id"`
	} `json:"server"`
	Data  json.RawMessage `json:"data"`
	Error *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

type connz struct {
	Total int `json:"total"`
	Conns []struct {
		CID    uint64    `json:"cid"`
		IP     string    `json:"ip"`
		Port   int       `json:"port"`
		Start  time.Time `json:"start"`
		User   string    `json:"authorized_user"`
		Issuer string    `json:"issuer_key"`
	} `json:"connections"`
}

type connzRequest struct {
	Account string `json:"acc"`
	Auth    bool   `json:"auth"`
	User    string `json:"user,omitempty"`
	Offset  int    `json:"offset"`
	Limit   int    `json:"limit"`
}

// lister lists connections of one account over a system-account connection.
type lister struct {
	nc       *nats.Conn
	account  string
	pageSize int
	// servers is how many servers answered the last complete listing: a
	// listing that hears from as many ends without waiting for stragglers;
	// ids are their IDs.
	servers int
	ids     []string
}

// list returns every live connection of the account on every server that
// answers (of user only, when user is set), with the number of servers
// that answered. A full listing waits for every server that answers; a quick
// one ends as soon as as many servers answered as the last full listing heard.
func (l *lister) list(ctx context.Context, user string, full bool) ([]Conn, int, error) {
	req := connzRequest{Account: l.account, Auth: true, User: user, Limit: l.pageSize}
	expect := l.servers
	if full {
		expect = 0
	}
	first, err := l.gather(ctx, req, expect)
	if err != nil {
		return nil, 0, err
	}
	var conns []Conn
	for _, r := range first {
		page, err := decodeConnz(r)
		if err != nil {
			return nil, 0, err
		}
		conns = append(conns, page.conns(r)...)
		// Further pages of this server, asked of it alone.
		for off := len(page.Conns); off < page.Total && len(page.Conns) > 0; off += len(page.Conns) {
			req.Offset = off
			next, err := l.one(ctx, fmt.Sprintf(subjectConnzOne, r.Server.ID), req)
			if err != nil {
				return nil, 0, err
			}
			if page, err = decodeConnz(next); err != nil {
				return nil, 0, err
			}
			conns = append(conns, page.conns(next)...)
		}
	}
	if full {
		l.servers = len(first)
		l.ids = l.ids[:0]
		for _, r := range first {
			l.ids = append(l.ids, r.Server.ID)
		}
	}
	return conns, len(first), nil
}

func decodeConnz(r apiResponse) (*connz, error) {
	if r.Error != nil {
		return nil, fmt.Errorf("kick: server %s answered the connection listing with %d %s", r.Server.Name, r.Error.Code, r.Error.Description)
	}
	var c connz
	if err := json.Unmarshal(r.Data, &c); err != nil {
		return nil, fmt.Errorf("kick: server %s: connection listing: %w", r.Server.Name, err)
	}
	return &c, nil
}

func (c *connz) conns(r apiResponse) []Conn {
	out := make([]Conn, 0, len(c.Conns))
	for _, ci := range c.Conns {
		out = append(out, Conn{
			ServerID: r.Server.ID, ServerName: r.Server.Name, CID: ci.CID,
			User: ci.User, Issuer: ci.Issuer, Addr: fmt.Sprintf("%s:%d", ci.IP, ci.Port), Start: ci.Start,
		})
	}
	return out
}

// gather asks every server and collects their answers: until expect
// servers answered (0: no such early end), or no further one answered for
// gatherQuiet, or RequestTimeout passed without any answer.
func (l *lister) gather(ctx context.Context, req connzRequest, expect int) ([]apiResponse, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("kick: %w", err)
	}
	if !l.nc.IsConnected() {
		return nil, notConnected(l.nc)
	}
	// An inbox of its own (_INBOX.<nuid>, within the kick identity's
	// _INBOX.> permission), not one under the connection's reply wildcard
	// (NewRespInbox): once one() has made that wildcard for a further page,
	// every answer to an inbox under it would come twice, to the wildcard
	// too, and a sweep would move each server's first page twice.
	inbox := l.nc.NewInbox()
	sub, err := l.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("kick: listing: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := l.nc.PublishRequest(SubjectConnzAll, inbox, body); err != nil {
		return nil, fmt.Errorf("kick: listing: %w", err)
	}
	var out []apiResponse
	seen := map[string]bool{}
	wait := RequestTimeout
	for len(out) < maxServers {
		if expect > 0 && len(out) >= expect {
			break
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("kick: listing: %w", ctx.Err())
			}
			break // quiet: every server that will answer has
		}
		var r apiResponse
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return nil, fmt.Errorf("kick: listing: undecodable answer: %w", err)
		}
		if seen[r.Server.ID] {
			continue
		}
		seen[r.Server.ID] = true
		out = append(out, r)
		wait = gatherQuiet
	}
	if len(out) == 0 {
		return nil, ErrNoServers
	}
	return out, nil
}

// one asks one server.
func (l *lister) one(ctx context.Context, subject string, req any) (apiResponse, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return apiResponse{}, fmt.Errorf("kick: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	m, err := l.nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return apiResponse{}, fmt.Errorf("kick: %s: %w", subject, err)
	}
	var r apiResponse
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return apiResponse{}, fmt.Errorf("kick: %s: undecodable answer: %w", subject, err)
	}
	return r, nil
}

// errGone is a kick of a connection that had already closed.
var errGone = errors.New("kick: connection already closed")

// kick ends one connection. A connection already gone is errGone: the kick's
// purpose is met.
func (l *lister) kick(ctx context.Context, c Conn) error {
	r, err := l.one(ctx, fmt.Sprintf(subjectKick, c.ServerID), map[string]uint64{"cid": c.CID})
	if err != nil {
		return err
	}
	if r.Error != nil {
		// nats-server's DisconnectClientByID: "no such client or leafnode id".
		if strings.Contains(r.Error.Description, "no such client") {
			return errGone
		}
		return fmt.Errorf("kick: server %s refused to end connection %d: %d %s", r.Server.Name, c.CID, r.Error.Code, r.Error.Description)
	}
	return nil
}
