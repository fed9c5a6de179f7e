//go:build linux

package fleet

// The fleet's steady state (issue 35, item 2's target): with nothing
// revoked, what the fleet's token rotation costs. Every Runner reconnects
// with a new token once per rotationPeriod (the kubelet rewrites a 600 s
// token at 80 %: docs/scale.md), by a handover: its new connection up, the
// old one closed runner.DefaultHandoverOverlap later. Each reconnect is an
// authorization at a callout and, after the duplicate grace, a duplicate
// check by the kicker that authorized it.

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/runner"
)

const (
	// rotationPeriod is how often each Runner reconnects with a new token:
	// 80 % of the 600 s a projected token lives.
	rotationPeriod = 480 * time.Second
	// rotatorCycle is how often one rotator hands over: longer than the
	// handover's overlap and the harness's duplicate grace (1 s), so that a
	// rotator's own connections never overlap past it.
	rotatorCycle = 2 * time.Second
)

// rotation is one steady-state measurement: a quiet window (the fleet
// connected, nothing happening) and a rotating window of the same length.
type rotation struct {
	rate               float64 // handovers a second: the fleet's n / rotationPeriod
	rotators           int
	handovers, failed  int64
	kicked             int64           // rotators' connections the servers closed: must be 0
	quiet, window      time.Duration   // the two windows' lengths
	quietSelf, rotSelf time.Duration   // this process's CPU (both callouts, the rotators)
	quietNode, rotNode []time.Duration // each nats-server's
}

// rotationCost has rotators of this process (Runner IDs apart from the
// fleet's) hand over at the rate the whole fleet of n would, n /
// rotationPeriod a second, for window, after a quiet window of the same
// length as the baseline, and reports the CPU of both.
func (f *fleet) rotationCost(t *testing.T, n int, window time.Duration) rotation {
	t.Helper()
	rt := rotation{rate: float64(n) / rotationPeriod.Seconds(), quiet: window}
	rt.rotators = max(1, int(math.Ceil(rt.rate*rotatorCycle.Seconds())))
	perRotator := int(window/rotatorCycle) + 2

	// Every token first: minting is not the fleet's cost.
	tokens := make([][]string, rt.rotators)
	for i := range tokens {
		node := fmt.Sprintf("rotator-%04d", i)
		for range perRotator {
			tok, err := f.issuer.Token(kubeissuer.Pod{NodeName: node}, tokenLifetime)
			if err != nil {
				t.Fatal(err)
			}
			tokens[i] = append(tokens[i], tok)
		}
	}
	// Each rotator's first connection, before the baseline.
	conns := make([]*rawConn, rt.rotators)
	var mu sync.Mutex
	watch := func(rc *rawConn) {
		go func() {
			if err := rc.serve(); closedByServer(err) {
				atomic.AddInt64(&rt.kicked, 1)
			}
		}()
	}
	for i := range conns {
		subj := commandSubject(t, "prod", fmt.Sprintf("rotator-%04d", i))
		rc, err := dialRunner(&netDialer, f.addrs[i%servers], tokens[i][0], subj)
		if err != nil {
			t.Fatalf("rotator %d: %v", i, err)
		}
		conns[i] = rc
		watch(rc)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, rc := range conns {
			rc.close()
		}
	})
	f.settle(t)

	// The baseline: nothing happens for window.
	c0, n0 := cpuSelf(), f.nodesCPU(t)
	time.Sleep(window) // the window measured, not a wait for something
	c1, n1 := cpuSelf(), f.nodesCPU(t)

	// The rotating window: rotator i hands over at i/rotators of each
	// cycle, so the handovers are spread evenly.
	start := time.Now()
	var wg sync.WaitGroup
	for i := range rt.rotators {
		wg.Go(func() {
			subj := commandSubject(t, "prod", fmt.Sprintf("rotator-%04d", i))
			offset := time.Duration(i) * rotatorCycle / time.Duration(rt.rotators)
			for j := 1; j < perRotator; j++ {
				at := start.Add(offset + time.Duration(j-1)*rotatorCycle)
				if at.Sub(start) >= window {
					return
				}
				time.Sleep(time.Until(at))
				rc, err := dialRunner(&netDialer, f.addrs[(i+j)%servers], tokens[i][j], subj)
				if err != nil {
					atomic.AddInt64(&rt.failed, 1)
					continue
				}
				watch(rc)
				atomic.AddInt64(&rt.handovers, 1)
				time.Sleep(runner.DefaultHandoverOverlap)
				mu.Lock()
				old := conns[i]
				conns[i] = rc
				mu.Unlock()
				old.close()
			}
		})
	}
	wg.Wait()
	if rest := window - time.Since(start); rest > 0 {
		time.Sleep(rest) // the window's end, measured like the baseline's
	}
	// The last handovers' duplicate checks fall due a grace later.
	time.Sleep(2 * time.Second)
	c2, n2 := cpuSelf(), f.nodesCPU(t)
	rt.window = time.Since(start)
	rt.quietSelf, rt.rotSelf = c1-c0, c2-c1
	for j := range n0 {
		rt.quietNode = append(rt.quietNode, n1[j]-n0[j])
		rt.rotNode = append(rt.rotNode, n2[j]-n1[j])
	}
	if rt.kicked > 0 {
		t.Errorf("%d rotator connections were closed by their server (a handover taken for a duplicate?)", rt.kicked)
	}
	return rt
}

const rotationHeader = "| connections | handovers/s (rotators) | handovers done (failed) | windows quiet / rotating | callouts' process CPU, quiet → rotating | n0 / n1 / n2 CPU, quiet → rotating | n0 / n1 / n2, % of a core, quiet → rotating |\n" +
	"|---|---|---|---|---|---|---|\n"

func (rt rotation) String(n int) string {
	pct := func(d time.Duration, w time.Duration) string {
		return fmt.Sprintf("%.1f %%", 100*d.Seconds()/w.Seconds())
	}
	var nodes, shares string
	for j := range rt.quietNode {
		if j > 0 {
			nodes += " / "
			shares += " / "
		}
		nodes += fmt.Sprintf("%s → %s", rt.quietNode[j].Round(10*time.Millisecond), rt.rotNode[j].Round(10*time.Millisecond))
		shares += pct(rt.quietNode[j], rt.quiet) + " → " + pct(rt.rotNode[j], rt.window)
	}
	return fmt.Sprintf("| %d | %.1f (%d) | %d (%d) | %s / %s | %s → %s (%s → %s) | %s | %s |\n",
		n, rt.rate, rt.rotators, rt.handovers, rt.failed, rt.quiet.Round(time.Second), rt.window.Round(time.Second),
		rt.quietSelf.Round(10*time.Millisecond), rt.rotSelf.Round(10*time.Millisecond), pct(rt.quietSelf, rt.quiet), pct(rt.rotSelf, rt.window),
		nodes, shares)
}
