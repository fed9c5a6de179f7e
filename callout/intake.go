package callout

// Intake: subscriptions in the queue group, the bounded worker pool, and the
// drain on shutdown.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// drainWait bounds how long a drain waits for the subscriptions to hand over
// the requests nats.go has already received: longer than any request's
// expiry (the server's auth timeout, 2 s by default), after which the server
// has given up on them anyway.
const drainWait = 5 * time.Second

// startFlushTimeout bounds the round trip that confirms the server has a
// subscription; on loopback or in a cluster it is milliseconds.
const startFlushTimeout = 10 * time.Second

// Start subscribes to Subject in the queue group on every connection and
// starts the workers. It returns once the server has every subscription (so
// the next CONNECT is answered). When ctx ends the responder stops taking
// requests, finishes the ones already received (each bounded by its own
// expiry) and closes Done. Start may be called once.
func (r *Responder) Start(ctx context.Context, conns ...*nats.Conn) error {
	if len(conns) == 0 {
		return errors.New("callout: start: no NATS connection")
	}
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("callout: start: already started")
	}
	// Requests are resolved under their own expiry, not under ctx, so that a
	// drain finishes the work already accepted.
	r.work = context.WithoutCancel(ctx)
	var lanes []*lane
	for i, nc := range conns {
		l := &lane{now: r.cfg.Now}
		sub, err := nc.QueueSubscribe(Subject, r.cfg.Queue, func(m *nats.Msg) { r.enqueue(m, l) })
		if err == nil {
			// The server may burst thousands of requests at once; queueing in
			// the client instead of dropping them as a slow consumer is what
			// lets a reconnect storm complete.
			err = sub.SetPendingLimits(-1, -1)
		}
		if err == nil {
			fctx, cancel := context.WithTimeout(ctx, startFlushTimeout)
			sent := r.cfg.Now()
			err = nc.FlushWithContext(fctx)
			cancel()
			if err == nil {
				// The connection's first lag, before its probe's.
				l.back(sent, r.cfg.Now())
			}
		}
		if err != nil {
			r.closeIntake()
			close(r.done)
			return fmt.Errorf("callout: start: subscribe on connection %d: %w", i, err)
		}
		r.subs = append(r.subs, sub)
		lanes = append(lanes, l)
	}
	r.lanes.Store(&lanes)
	for i, l := range lanes {
		r.probes.Add(1)
		go func() {
			defer r.probes.Done()
			l.probe(ctx, conns[i])
		}()
	}
	for range r.cfg.Workers {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for j, ok := r.jobs.pop(); ok; j, ok = r.jobs.pop() {
				r.slots <- struct{}{}
				r.handle(r.work, j)
				<-r.slots
				r.inflight.Add(-1)
			}
		}()
	}
	go func() {
		<-ctx.Done()
		r.drain()
	}()
	return nil
}

// job is a delivered request and when it arrived: the callback's clock
// reading, the start of the request's age (see Config.AnswerHorizon).
type job struct {
	m       *nats.Msg
	arrived time.Time
}

// enqueue is every subscription's callback: it stamps the request's arrival
// and hands it on without ever blocking, so that the next request on the same
// connection is stamped when it arrives, not when a slow resolve (a key
// fetch, a database lookup) ahead of it ends. The stamp is moved back by the
// lag of the connection it came on (see lag.go): an answer published on it
// waits that long before the server handles it.
//
// When fewer than Workers requests are being handled, the request gets a
// goroutine of its own at once: it is the newest request, which a worker
// would take first anyway, and starting a goroutine costs less on the latency
// of every CONNECT than waking a worker. Otherwise it waits on the stack
// (when the stack is full the oldest request goes).
func (r *Responder) enqueue(m *nats.Msg, l *lane) {
	j := job{m: m, arrived: r.cfg.Now().Add(-l.lag())}
	// Held while this callback may start a request, so that a drain that
	// write-locks it next finds the request counted in wg.
	r.inlineMu.RLock()
	defer r.inlineMu.RUnlock()
	if r.stopping.Load() {
		r.observe(r.work, Event{Outcome: OutcomeDropped, Reason: DropShuttingDown, Sealed: m.Header.Get(XKeyHeader) != ""})
		return
	}
	r.inflight.Add(1)
	select {
	case r.slots <- struct{}{}:
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.handle(r.work, j)
			<-r.slots
			r.inflight.Add(-1)
		}()
		return
	default:
	}
	if old, dropped := r.jobs.push(j); dropped {
		r.inflight.Add(-1)
		reason := DropOverload
		if old.m == m {
			reason = DropShuttingDown
		}
		r.observe(r.work, Event{Outcome: OutcomeDropped, Reason: reason, Sealed: old.m.Header.Get(XKeyHeader) != ""})
	}
}

// closeIntake makes later deliveries drop and lets the workers end once the
// stack is empty.
func (r *Responder) closeIntake() {
	r.stopping.Store(true)
	r.jobs.close()
}

// drain unsubscribes, waits (bounded) for nats.go to deliver what it already
// received, lets the workers finish the queue and closes Done.
func (r *Responder) drain() {
	for _, s := range r.subs {
		// The server stops sending; messages already received are still delivered.
		_ = s.Drain()
	}
	timer := time.NewTimer(r.drainWait)
	defer timer.Stop()
wait:
	for _, s := range r.subs {
		select {
		case <-s.StatusChanged(nats.SubscriptionClosed):
		case <-timer.C:
			break wait
		}
	}
	r.closeIntake()
	// Wait for callbacks that may still start a request, then for the
	// requests' goroutines and the workers.
	r.inlineMu.Lock()
	//lint:ignore SA2001 the empty critical section is the wait: every callback holds the read lock until its request is counted in wg
	r.inlineMu.Unlock()
	r.wg.Wait()
	r.probes.Wait()
	close(r.done)
}

// handle decides one request and answers it, or drops it.
func (r *Responder) handle(ctx context.Context, j job) {
	start := time.Now()
	ev := r.decide(ctx, j)
	end := time.Now()
	ev.Latency = end.Sub(start)
	if answered(ev.Outcome) && !ev.RequestExpiry.IsZero() {
		ev.Slack = ev.RequestExpiry.Sub(end)
	}
	r.observe(ctx, ev)
}

func (r *Responder) observe(ctx context.Context, ev Event) {
	r.logEvent(ctx, ev)
	if r.cfg.Observe != nil {
		r.cfg.Observe(ev)
	}
}
