package callout

import "sync"

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
	buf    []job // ring: oldest at head, newest at head+n-1
	head   int
	n      int
	closed bool
}

func newStack(capacity int) *stack {
	s := &stack{buf: make([]job, capacity)}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// push adds j. It returns the request it evicted to make room (the oldest),
// or j itself when the stack is closed, for the caller to count as dropped;
// dropped is false otherwise. It never blocks.
func (s *stack) push(j job) (old job, dropped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return j, true
	}
	if s.n == len(s.buf) {
		old, dropped = s.buf[s.head], true
		s.buf[s.head] = job{}
		s.head = (s.head + 1) % len(s.buf)
		s.n--
	}
	s.buf[(s.head+s.n)%len(s.buf)] = j
	s.n++
	s.cond.Signal()
	return old, dropped
}

// pop returns the newest request, waiting for one; ok is false once the
// stack is closed and empty.
func (s *stack) pop() (j job, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.n == 0 && !s.closed {
		s.cond.Wait()
	}
	if s.n == 0 {
		return job{}, false
	}
	i := (s.head + s.n - 1) % len(s.buf)
	j = s.buf[i]
	s.buf[i] = job{}
	s.n--
	return j, true
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
