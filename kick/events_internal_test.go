package kick

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/testutil"
)

// connect is a connection to an in-process nats-server of its own.
func connect(t *testing.T) *nats.Conn {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// The index as a full listing and the events held while it ran make it:
// what each duplicate check may settle, and when it is whole.
func TestIndexSettles(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	grant := func(user, server string, cid uint64) *Grant {
		return &Grant{RunnerID: user, ServerID: server, CID: cid}
	}
	ix := &index{byUser: map[string]map[key]entry{}, users: map[key]string{}, nc: connect(t)}
	if ix.usable() {
		t.Fatal("an index no listing made is whole")
	}
	// Before the listing: A's CONNECT event.
	ix.apply(indexEvent{up: true, user: "prod/a", k: key{"S1", 1}, start: at(0), event: true})
	ix.beginListing()
	// While it runs: B (a handover of a) connects, A disconnects, and C
	// (another Runner) connects; D connected before and is only in the
	// listing.
	for _, e := range []indexEvent{
		{up: true, user: "prod/a", k: key{"S2", 7}, start: at(5), event: true},
		{up: false, user: "prod/a", k: key{"S1", 1}, event: true},
		{up: true, user: "prod/c", k: key{"S1", 2}, start: at(6), event: true},
	} {
		ix.listing = append(ix.listing, e)
		ix.apply(e)
	}
	ix.endListing([]Conn{
		{User: "prod/a", ServerID: "S1", CID: 1, Start: at(0)},
		{User: "prod/d", ServerID: "S3", CID: 4, Start: at(1)},
	}, []string{"S1", "S2", "S3"}, true)
	if !ix.usable() {
		t.Fatal("the index is not whole after a complete listing")
	}
	for _, tc := range []struct {
		name string
		g    *Grant
		want bool
	}{
		{"the handover's new connection, the old one gone", grant("prod/a", "S2", 7), true},
		{"a connection seen by its event during the listing", grant("prod/c", "S1", 2), true},
		{"a connection in the listing alone (its event never seen)", grant("prod/d", "S3", 4), false},
		{"a connection not in the index", grant("prod/e", "S1", 9), false},
	} {
		if got := ix.settles(tc.g); got != tc.want {
			t.Errorf("%s: settles = %v, want %v", tc.name, got, tc.want)
		}
	}
	// A copy of c connects: c's check is no longer settled (an older one
	// for the copy's; the copy's own has c older).
	ix.apply(indexEvent{up: true, user: "prod/c", k: key{"S2", 8}, start: at(9), event: true})
	if ix.settles(grant("prod/c", "S2", 8)) {
		t.Error("the copy's check settled with the original live and older")
	}
	if ix.size() != 4 {
		t.Errorf("size %d, want 4", ix.size())
	}
	// A listing that failed (or heard fewer servers) keeps the index's
	// connections, but it is no longer whole: a server not heard may hold
	// connections it does not know of.
	ix.beginListing()
	ix.endListing(nil, nil, false)
	if ix.size() != 4 || ix.usable() {
		t.Errorf("after a failed listing: size %d, usable %v; want 4, false", ix.size(), ix.usable())
	}
	if why := ix.why(); why != "a listing did not hear every server the last one did" {
		t.Errorf("why %q", why)
	}
	// A full listing makes it whole again; then an event from a server it
	// did not hear (restarted with a new ID, back after a partition) does
	// not.
	ix.beginListing()
	ix.endListing([]Conn{{User: "prod/d", ServerID: "S3", CID: 4, Start: at(1)}}, []string{"S3"}, true)
	if !ix.usable() {
		t.Fatal("not whole after a complete listing")
	}
	k := &Kicker{cfg: Config{Issuers: []string{"RUNNERS"}}}
	k.event(ix, []byte(`{"server":{"name":"s3","id":"S3"},"client":{"id":5,"user":"prod/e","issuer_key":"RUNNERS"}}`), true)
	if !ix.usable() || ix.size() != 2 {
		t.Fatalf("an event from a known server: usable %v, size %d; want true, 2", ix.usable(), ix.size())
	}
	k.event(ix, []byte(`{"server":{"name":"s9","id":"S9"},"client":{"id":1,"user":"prod/f","issuer_key":"RUNNERS"}}`), true)
	if ix.usable() {
		t.Fatal("whole after an event from a server the listing did not hear")
	}
	if why := ix.why(); !strings.Contains(why, "(s9)") {
		t.Errorf("why %q does not name the server", why)
	}
	// A message dropped by a subscription of the index: no longer whole.
	sub, err := ix.nc.Subscribe("flood", func(*nats.Msg) { time.Sleep(10 * time.Millisecond) })
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(1, -1); err != nil {
		t.Fatal(err)
	}
	ix.subs = append(ix.subs, sub)
	ix.beginListing()
	ix.endListing(nil, nil, true)
	for range 100 {
		if err := ix.nc.Publish("flood", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := ix.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the index no longer whole after its subscription dropped messages", func() bool { return !ix.usable() })
}

// The index vouches for itself with the Kicker's own grants: a connection
// this process authorized since the last listing, more than grantSettle
// ago, whose CONNECT event never came, makes the next sweep list (the
// events do not reach the kick identity, and nothing else showed it); once
// announced, or once a listing is newer than the grant, the index serves
// again.
func TestSweepsListWhileAGrantIsUnannounced(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	now := t0
	ix := &index{byUser: map[string]map[key]entry{}, users: map[key]string{}, nc: connect(t)}
	ix.beginListing()
	ix.endListing(nil, []string{"S1"}, true)
	k := &Kicker{cfg: Config{Issuers: []string{"RUNNERS"}, ListInterval: DefaultListInterval, Now: func() time.Time { return now }},
		log: slog.New(slog.DiscardHandler), ix: ix, ixWhole: true, listedAt: t0, grants: map[key]*Grant{}}
	k.grants[key{"S1", 7}] = &Grant{RunnerID: "prod/a", ServerID: "S1", CID: 7, Expiry: t0.Add(time.Hour), at: t0.Add(time.Second)}

	now = t0.Add(time.Second + grantSettle - time.Millisecond)
	if k.mustList([]string{"cluster_file"}) {
		t.Fatal("listed for a grant younger than grantSettle")
	}
	now = t0.Add(time.Second + grantSettle)
	if !k.mustList([]string{"cluster_file"}) {
		t.Fatal("the index served with a grant grantSettle old never announced")
	}
	k.event(ix, []byte(`{"server":{"name":"s1","id":"S1"},"client":{"id":7,"user":"prod/a","issuer_key":"RUNNERS"}}`), true)
	if k.mustList([]string{"cluster_file"}) {
		t.Fatal("listed once the grant's connection was announced")
	}
	// Another, never announced, then a listing newer than it.
	k.grants[key{"S1", 8}] = &Grant{RunnerID: "prod/b", ServerID: "S1", CID: 8, Expiry: t0.Add(time.Hour), at: t0.Add(2 * time.Second)}
	now = t0.Add(time.Minute)
	if !k.mustList([]string{"periodic"}) {
		t.Fatal("the index served with a second grant never announced")
	}
	ix.beginListing()
	ix.endListing(nil, []string{"S1"}, true)
	k.listedAt = now
	if k.mustList([]string{"periodic"}) {
		t.Fatal("listed again for grants older than the last listing")
	}
}
