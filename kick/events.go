package kick

// The account's connect and disconnect events: an index of the live Runner
// connections that spares the servers a listing for each duplicate check.
//
// Every authorization is followed, a grace later, by a duplicate check: is
// there an older live connection of the same Runner ID? Asked of the
// servers, that is a filtered CONNZ on every server, and nats-server answers
// it by scanning every connection of the account: at the fleet's steady
// state (each Runner reconnects with a new token every 480 s) that is
// n / 480 scans of n a second on each server, n² again. The servers already
// announce each client of the account connecting and disconnecting
// ($SYS.ACCOUNT.<account>.CONNECT and .DISCONNECT); a Kicker whose identity
// may subscribe to them keeps the live connections by Runner ID from the
// last full listing and the events since, and a duplicate check that the
// index shows has no older connection is done with no request at all. The
// index only ever spares a request: a check it cannot settle (an older
// connection in it, the new one not in it yet) lists that Runner ID from
// the servers as before, so a stale entry costs a listing, never a kick.
//
// An event lost is the attacker's window: an older connection whose CONNECT
// was never seen would not be found. So the index is used only while it is
// whole: built by a full listing (every sweep makes one), with every event
// received since; it is whole no longer once the kick identity's connection
// has reconnected (events were missed meanwhile) or the subscription has
// dropped a message (a slow consumer), until the next full listing, which
// the Kicker then asks for at once.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// SubjectConnectEvents and SubjectDisconnectEvents, formatted with the
// Runners' account (its name, or its public key in operator mode), are the
// subjects the servers announce that account's clients on. The kick
// identity may subscribe to both (docs/self-host.md, "The kick identity");
// without that permission the Kicker lists instead, as before.
const (
	SubjectConnectEvents    = "$SYS.ACCOUNT.%s.CONNECT"
	SubjectDisconnectEvents = "$SYS.ACCOUNT.%s.DISCONNECT"
)

// EventSubjects are the two event subjects of account, which the kick
// identity's subscribe permission lists besides its reply inboxes.
func EventSubjects(account string) []string {
	return []string{fmt.Sprintf(SubjectConnectEvents, account), fmt.Sprintf(SubjectDisconnectEvents, account)}
}

// maxEventPending bounds the events waiting to be applied: far above the
// rate of a fleet's reconnect storm for the time a listing takes (a
// listing's events are held until it ends). Past it the subscription drops
// events and the index is not whole until the next full listing.
const maxEventPending = 1 << 20

// maxAnnounced bounds the connections remembered as announced by a CONNECT
// event between two listings (at 100,000 Runners rotating, about 62,500 in
// 5 minutes). Past it, no connection counts as announced and every sweep
// lists until the next listing.
const maxAnnounced = 1 << 20

// connEvent is the part of nats-server's ConnectEventMsg and
// DisconnectEventMsg that the index reads.
type connEvent struct {
	Server struct {
		Name string `json:"name"`
		ID   string `json:"id"`
	} `json:"server"`
	Client struct {
		Start  *time.Time `json:"start"`
		Host   string     `json:"host"`
		CID    uint64     `json:"id"`
		User   string     `json:"user"`
		Issuer string     `json:"issuer_key"`
	} `json:"client"`
}

// index is the account's live callout-issued connections by Runner ID.
type index struct {
	mu     sync.Mutex
	byUser map[string]map[key]entry // Runner ID → connection
	users  map[key]string           // connection → Runner ID
	// whole: built by a full listing, and no event lost since; lost says
	// why it stopped being whole, for the log.
	whole bool
	lost  string
	// known are the servers that answered the listing that made the index
	// whole: an event from another (a server restarted with a new ID, a
	// region back after a partition) shows connections no listing saw.
	known map[string]bool
	// announced are the connections whose CONNECT event arrived since the
	// listing that made the index whole (at most maxAnnounced; over: full),
	// which the Kicker checks its own grants against: a connection it
	// authorized that the events never announced shows they do not flow.
	announced map[key]bool
	full      bool
	// listing holds the events received while a full listing runs; nil
	// when none runs.
	listing []indexEvent
	// reconnects and dropped are the connection's reconnects and the
	// subscriptions' dropped messages when the index was last made whole.
	reconnects uint64
	dropped    int
	subs       []*nats.Subscription
	nc         *nats.Conn
}

type indexEvent struct {
	up     bool // CONNECT; else DISCONNECT
	user   string
	k      key
	server string // the server's name
	start  time.Time
	event  bool // from an event; else from a listing
}

// entry is one connection in the index.
type entry struct {
	server string // its server's name, for the log
	start  time.Time
	event  bool // its CONNECT event was seen
}

// followEvents subscribes to the account's connect and disconnect events.
// It returns nil and the reason when the kick identity may not (the server
// refused the subscription) or the subscription failed.
func (k *Kicker) followEvents() (*index, error) {
	nc := k.cfg.Conn
	ix := &index{byUser: map[string]map[key]entry{}, users: map[key]string{}, announced: map[key]bool{}, nc: nc}
	for _, f := range []struct {
		subj string
		up   bool
	}{{SubjectConnectEvents, true}, {SubjectDisconnectEvents, false}} {
		subj := fmt.Sprintf(f.subj, k.cfg.Account)
		up := f.up
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) { k.event(ix, m.Data, up) })
		if err != nil {
			ix.stop()
			return nil, fmt.Errorf("kick: subscribing to %s: %w", subj, err)
		}
		_ = sub.SetPendingLimits(maxEventPending, -1)
		ix.subs = append(ix.subs, sub)
	}
	// A refused subscription is answered with -ERR before the PONG of this
	// flush, and nats.go records it as the connection's last error. This is
	// for the operator's log line only: the index never settles a check
	// without the CONNECT event of the very connection checked, so events
	// that do not come (refused later, on another server after a
	// reconnect) cost listings, never a missed duplicate. A connection
	// that is down now resends the subscriptions when it is back.
	if nc.Flush() == nil {
		if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) &&
			(strings.Contains(err.Error(), ix.subs[0].Subject) || strings.Contains(err.Error(), ix.subs[1].Subject)) {
			ix.stop()
			return nil, err
		}
	}
	return ix, nil
}

func (ix *index) stop() {
	for _, s := range ix.subs {
		_ = s.Unsubscribe()
	}
}

// event applies one connect or disconnect event of a callout-issued user.
func (k *Kicker) event(ix *index, data []byte, up bool) {
	var ev connEvent
	if json.Unmarshal(data, &ev) != nil || ev.Client.CID == 0 || ev.Server.ID == "" {
		return // not an event this index can use; the next listing corrects it
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.whole && !ix.known[ev.Server.ID] {
		ix.whole, ix.lost = false, "a server the last listing did not hear ("+ev.Server.Name+") announced a connection: a server restarted, or a region is back after a partition"
	}
	c := Conn{User: ev.Client.User, Issuer: ev.Client.Issuer}
	if !k.calloutUser(c) {
		return
	}
	e := indexEvent{up: up, user: ev.Client.User, k: key{ev.Server.ID, ev.Client.CID}, server: ev.Server.Name, event: true}
	if up {
		switch {
		case ix.announced == nil:
			ix.announced = map[key]bool{e.k: true}
		case len(ix.announced) < maxAnnounced:
			ix.announced[e.k] = true
		default:
			ix.full = true
		}
	}
	if ev.Client.Start != nil {
		e.start = *ev.Client.Start
	}
	if ix.listing != nil {
		ix.listing = append(ix.listing, e)
	}
	ix.apply(e)
}

func (ix *index) apply(e indexEvent) {
	if e.up {
		m := ix.byUser[e.user]
		if m == nil {
			m = map[key]entry{}
			ix.byUser[e.user] = m
		}
		old, had := m[e.k]
		m[e.k] = entry{server: e.server, start: e.start, event: e.event || (had && old.event)}
		ix.users[e.k] = e.user
		return
	}
	ix.remove(e.k)
}

func (ix *index) remove(k key) {
	user, ok := ix.users[k]
	if !ok {
		return
	}
	delete(ix.users, k)
	if m := ix.byUser[user]; m != nil {
		delete(m, k)
		if len(m) == 0 {
			delete(ix.byUser, user)
		}
	}
}

// counters are the connection's reconnects and the subscriptions' dropped
// messages: when either grew since the index was made whole, events were
// lost.
func (ix *index) counters() (uint64, int) {
	dropped := 0
	for _, s := range ix.subs {
		if n, err := s.Dropped(); err == nil {
			dropped += n
		}
	}
	return ix.nc.Stats().Reconnects, dropped
}

// beginListing starts holding the events that arrive while a full listing
// runs.
func (ix *index) beginListing() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.listing = []indexEvent{}
}

// endListing rebuilds the index from a full listing's callout-issued
// connections and the events received while it ran, and makes it whole
// unless events were lost; servers are the IDs of the servers that
// answered. With ok false (the listing failed or heard from fewer servers
// than it should) the index keeps its connections but is not whole: a
// server it did not hear may hold connections it no longer knows of, or
// none of those it lists.
func (ix *index) endListing(conns []Conn, servers []string, ok bool) {
	reconnects, dropped := ix.counters()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	held := ix.listing
	ix.listing = nil
	if !ok {
		if ix.whole {
			ix.whole, ix.lost = false, "a listing did not hear every server the last one did"
		}
		return
	}
	prev := ix.byUser
	ix.byUser, ix.users = map[string]map[key]entry{}, map[key]string{}
	for _, c := range conns {
		// A connection whose CONNECT event was seen before the listing
		// keeps that mark.
		ix.apply(indexEvent{up: true, user: c.User, k: c.key(), server: c.ServerName, start: c.Start, event: prev[c.User][c.key()].event})
	}
	for _, e := range held {
		ix.apply(e)
	}
	// Announcements before the listing's start are in the listing or gone:
	// those held while it ran stay.
	ix.announced, ix.full = map[key]bool{}, false
	for _, e := range held {
		if e.up {
			ix.announced[e.k] = true
		}
	}
	ix.known = make(map[string]bool, len(servers))
	for _, id := range servers {
		ix.known[id] = true
	}
	ix.whole, ix.lost, ix.reconnects, ix.dropped = true, "", reconnects, dropped
}

// usable reports whether the index is whole now; it stops being so (until
// the next full listing) once an event may have been lost.
func (ix *index) usable() bool {
	reconnects, dropped := ix.counters()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.whole && (reconnects != ix.reconnects || dropped != ix.dropped) {
		ix.whole, ix.lost = false, "events were lost: the kick identity's connection reconnected, or a subscription dropped some (a slow consumer)"
	}
	return ix.whole
}

// wasAnnounced reports whether k's CONNECT event arrived since the index was
// made whole; false, whatever k, once more arrived than it remembers.
func (ix *index) wasAnnounced(k key) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return !ix.full && ix.announced[k]
}

// why says why the index stopped being whole.
func (ix *index) why() string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.lost
}

// settles reports whether the index shows, for the connection g names, no
// older live connection of its Runner ID: the connection is in the index
// and every other connection of the Runner ID started after it. Anything
// else (an older one, or the connection not seen yet) is for a listing.
// The connection's own CONNECT event must have been seen (being in a
// listing is not enough): that is what shows the events flow, so an index
// whose events stopped (refused, or lost unnoticed) settles nothing.
func (ix *index) settles(g *Grant) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	m := ix.byUser[g.RunnerID]
	mine, ok := m[key{g.ServerID, g.CID}]
	if !ok || !mine.event {
		return false
	}
	for kk, e := range m {
		if kk != (key{g.ServerID, g.CID}) && !e.start.After(mine.start) {
			return false
		}
	}
	return true
}

// conns is every connection in the index, as a listing would show it to a
// Policy: its server's ID and name, client ID, Runner ID, start.
func (ix *index) conns() []Conn {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := make([]Conn, 0, len(ix.users))
	for user, m := range ix.byUser {
		for kk, e := range m {
			out = append(out, Conn{ServerID: kk.server, ServerName: e.server, CID: kk.cid, User: user, Start: e.start})
		}
	}
	return out
}

// size is the connections in the index.
func (ix *index) size() int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return len(ix.users)
}
