package runner

import (
	"testing"
	"time"
)

func TestReconnectDelayDoublesItsWindowUpToTheCap(t *testing.T) {
	const wait, jitter, maxJitter = 2 * time.Second, 3 * time.Second, 20 * time.Second
	delay := ReconnectDelay(wait, jitter, maxJitter)
	for _, tc := range []struct {
		attempts int
		window   time.Duration
	}{
		{1, 3 * time.Second}, // as nats.ReconnectWait + nats.ReconnectJitter
		{2, 6 * time.Second},
		{3, 12 * time.Second},
		{4, 20 * time.Second}, // capped
		{40, 20 * time.Second},
	} {
		// Enough draws that the whole window shows: the largest delay seen
		// must come close to its top, and none may leave it.
		var lo, hi time.Duration = time.Hour, 0
		for range 2000 {
			d := delay(tc.attempts)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < wait || hi >= wait+tc.window {
			t.Errorf("attempt %d: delays in [%v, %v], want within [%v, %v)", tc.attempts, lo, hi, wait, wait+tc.window)
		}
		if hi < wait+tc.window*9/10 {
			t.Errorf("attempt %d: largest delay %v, want near %v: the window did not grow", tc.attempts, hi, wait+tc.window)
		}
	}
	if d := ReconnectDelay(wait, 0, 0)(5); d != wait {
		t.Errorf("no jitter: delay %v, want %v", d, wait)
	}
}
