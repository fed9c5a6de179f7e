package callout

import (
	"testing"

	"github.com/nats-io/nats.go"
)

func TestStackNewestFirstEvictsOldest(t *testing.T) {
	s := newStack(3)
	msgs := make([]*nats.Msg, 5)
	for i := range msgs {
		msgs[i] = &nats.Msg{Subject: string(rune('a' + i))}
	}
	for i := range 3 {
		if d := s.push(msgs[i]); d != nil {
			t.Fatalf("push %d evicted %s", i, d.Subject)
		}
	}
	if d := s.push(msgs[3]); d != msgs[0] {
		t.Fatalf("full push evicted %v, want the oldest", d)
	}
	if d := s.push(msgs[4]); d != msgs[1] {
		t.Fatalf("full push evicted %v, want the oldest", d)
	}
	if got := s.len(); got != 3 {
		t.Fatalf("len %d", got)
	}
	for _, want := range []string{"e", "d", "c"} {
		if m := s.pop(); m.Subject != want {
			t.Fatalf("pop %s, want %s", m.Subject, want)
		}
	}
	s.push(msgs[0])
	s.close()
	if d := s.push(msgs[1]); d != msgs[1] {
		t.Fatal("push after close accepted")
	}
	if m := s.pop(); m != msgs[0] {
		t.Fatal("queued request lost at close")
	}
	if m := s.pop(); m != nil {
		t.Fatal("pop after close and empty did not return nil")
	}
}

func TestStackPopWaitsForPush(t *testing.T) {
	s := newStack(2)
	got := make(chan *nats.Msg)
	go func() { got <- s.pop() }()
	m := &nats.Msg{Subject: "x"}
	s.push(m)
	if <-got != m {
		t.Fatal("waiting pop did not get the pushed request")
	}
	go func() { got <- s.pop() }()
	s.close()
	if <-got != nil {
		t.Fatal("waiting pop not released by close")
	}
}
