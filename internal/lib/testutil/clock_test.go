package testutil

import (
	"sync"
	"testing"
	"time"
)

// A Clock moves only when told to, by Advance and Set, also from several
// goroutines at once.
func TestClockMovesOnlyWhenTold(t *testing.T) {
	start := time.Unix(1_900_000_000, 0)
	c := NewClock(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now = %v, want %v", c.Now(), start)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); c.Advance(time.Second) }()
	}
	wg.Wait()
	if want := start.Add(10 * time.Second); !c.Now().Equal(want) {
		t.Fatalf("Now after ten Advance(1s) = %v, want %v", c.Now(), want)
	}
	c.Set(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now after Set = %v, want %v", c.Now(), start)
	}
}
