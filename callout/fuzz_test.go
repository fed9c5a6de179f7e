package callout

import (
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
)

// FuzzAnswer feeds arbitrary request bytes to Answer. Whatever comes in,
// nothing is answered that nats-io/jwt does not itself decode and verify as an
// authorization request, and nothing panics.
func FuzzAnswer(f *testing.F) {
	fx := newFixture(f)
	tok := fx.token(f, "node-f", 0)
	_, genuine := fx.request(f, tok, func(c *jwt.AuthorizationRequestClaims) { c.Expires = time.Now().Add(time.Hour).Unix() })
	f.Add([]byte(genuine))
	f.Add([]byte(genuine[:len(genuine)-4] + "AAAA"))
	f.Add([]byte("a.b.c"))
	f.Add([]byte("e30.e30.e30"))
	r := fx.responder(f, false, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		r.replayMu.Lock()
		clear(r.replay) // the genuine seed is answered every time it comes
		r.replayMu.Unlock()
		resp, ev := r.Answer(t.Context(), "", data)
		if resp == nil {
			if ev.Outcome != OutcomeDropped && ev.Outcome != OutcomeError {
				t.Fatalf("no answer, outcome %s", ev.Outcome)
			}
			return
		}
		if _, err := jwt.DecodeAuthorizationRequestClaims(string(data)); err != nil {
			t.Fatalf("answered (%s) a request the library refuses: %v", ev.Outcome, err)
		}
	})
}
