package callout

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/nats-io/nats.go"
)

// A reconnecting callout connection goes to the server fewest of the other
// connections are on, never back to the one it lost, nor to one that failed
// in this outage; with none left it leaves the choice to nats.go.
func TestLeastUsedKeepsConnectionsApart(t *testing.T) {
	pool := func(failed ...int) []nats.Server {
		var p []nats.Server
		for i := range 3 {
			s := nats.Server{URL: &url.URL{Scheme: "nats", Host: fmt.Sprintf("n%d:4222", i)}}
			for _, f := range failed {
				if f == i {
					s.Reconnects = 1
				}
			}
			p = append(p, s)
		}
		return p
	}
	for _, tc := range []struct {
		name  string
		pool  []nats.Server
		lost  string
		on    map[int]string // connection 0 is the one reconnecting
		start int
		want  int
	}{
		{"the emptiest survivor", pool(), "n2:4222", map[int]string{0: "n2:4222", 1: "n1:4222", 2: "n1:4222", 3: "n0:4222"}, 0, 0},
		{"the emptiest survivor from any start", pool(), "n2:4222", map[int]string{0: "n2:4222", 1: "n1:4222", 2: "n1:4222", 3: "n0:4222"}, 1, 0},
		{"a node back with none of them", pool(), "n1:4222", map[int]string{0: "n1:4222", 1: "n1:4222", 2: "n2:4222"}, 1, 0},
		{"its own earlier pick does not count", pool(), "n2:4222", map[int]string{0: "n0:4222", 1: "n1:4222"}, 0, 0},
		{"a tie goes to the first from start", pool(), "n2:4222", map[int]string{0: "n2:4222", 1: "n0:4222", 2: "n1:4222"}, 1, 1},
		{"a server that failed is skipped", pool(0), "n2:4222", map[int]string{0: "n2:4222", 1: "n1:4222", 2: "n1:4222"}, 0, 1},
		{"every other server failed", pool(0, 1), "n2:4222", map[int]string{0: "n2:4222"}, 0, -1},
		{"the lost server alone", pool()[2:], "n2:4222", map[int]string{0: "n2:4222"}, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := leastUsed(tc.pool, tc.lost, tc.on, 0, tc.start); got != tc.want {
				t.Fatalf("leastUsed = %d, want %d", got, tc.want)
			}
		})
	}
}
