package callout

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// stack is the bounded hand-off between the subscriptions and the workers.
// Workers take the newest request first and, when full, the oldest is
// dropped: under overload a request that has waited longest is the one the
// server is about to give up on (it waits only its auth timeout), so serving
// newest-first keeps the callout answering requests that can still succeed
// instead of collapsing into answering only abandoned ones. Below capacity
// the order does not matter: requests are taken as fast as they come.
type stack struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []*nats.Msg // ring: oldest at head, newest at head+n-1
	head   int
	n      int
	closed bool
}

func newStack(capacity int) *stack {
	s := &stack{buf: make([]*nats.Msg, capacity)}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// push adds m. It returns the request it evicted to make room (the oldest),
// or m itself when the stack is closed, for the caller to count as dropped;
// nil otherwise. It never blocks.
func (s *stack) push(m *nats.Msg) (dropped *nats.Msg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return m
	}
	if s.n == len(s.buf) {
		dropped = s.buf[s.head]
		s.buf[s.head] = nil
		s.head = (s.head + 1) % len(s.buf)
		s.n--
	}
	s.buf[(s.head+s.n)%len(s.buf)] = m
	s.n++
	s.cond.Signal()
	return dropped
}

// pop returns the newest request, waiting for one; nil once the stack is
// closed and empty.
func (s *stack) pop() *nats.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.n == 0 && !s.closed {
		s.cond.Wait()
	}
	if s.n == 0 {
		return nil
	}
	i := (s.head + s.n - 1) % len(s.buf)
	m := s.buf[i]
	s.buf[i] = nil
	s.n--
	return m
}

// close makes later pushes fail and wakes every waiting pop; requests
// already queued are still popped.
func (s *stack) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.cond.Broadcast()
}

// len is the number of queued requests.
func (s *stack) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
