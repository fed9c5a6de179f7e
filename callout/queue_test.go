package callout

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestStackNewestFirstEvictsOldest(t *testing.T) {
	s := newStack(3)
	jobs := make([]job, 5)
	for i := range jobs {
		jobs[i] = job{m: &nats.Msg{Subject: string(rune('a' + i))}, arrived: time.Unix(int64(i), 0)}
	}
	for i := range 3 {
		if d, dropped := s.push(jobs[i]); dropped {
			t.Fatalf("push %d evicted %s", i, d.m.Subject)
		}
	}
	if d, dropped := s.push(jobs[3]); !dropped || d != jobs[0] {
		t.Fatalf("full push evicted %v (%v), want the oldest", d, dropped)
	}
	if d, dropped := s.push(jobs[4]); !dropped || d != jobs[1] {
		t.Fatalf("full push evicted %v (%v), want the oldest", d, dropped)
	}
	if got := s.len(); got != 3 {
		t.Fatalf("len %d", got)
	}
	for _, want := range []job{jobs[4], jobs[3], jobs[2]} {
		// The arrival travels with its request.
		if j, ok := s.pop(); !ok || j != want {
			t.Fatalf("pop %s at %v, want %s at %v", j.m.Subject, j.arrived, want.m.Subject, want.arrived)
		}
	}
	s.push(jobs[0])
	s.close()
	if d, dropped := s.push(jobs[1]); !dropped || d != jobs[1] {
		t.Fatal("push after close accepted")
	}
	if j, ok := s.pop(); !ok || j != jobs[0] {
		t.Fatal("queued request lost at close")
	}
	if _, ok := s.pop(); ok {
		t.Fatal("pop after close and empty returned a request")
	}
}

func TestStackPopWaitsForPush(t *testing.T) {
	s := newStack(2)
	type popped struct {
		j  job
		ok bool
	}
	got := make(chan popped)
	go func() { j, ok := s.pop(); got <- popped{j, ok} }()
	j := job{m: &nats.Msg{Subject: "x"}, arrived: time.Unix(7, 0)}
	s.push(j)
	if p := <-got; !p.ok || p.j != j {
		t.Fatal("waiting pop did not get the pushed request")
	}
	go func() { j, ok := s.pop(); got <- popped{j, ok} }()
	s.close()
	if p := <-got; p.ok {
		t.Fatal("waiting pop not released by close")
	}
}
