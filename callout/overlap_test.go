package callout

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/compass-runner/identity/verifier"
)

// countingResolver counts the tokens it is asked to verify.
type countingResolver struct {
	Resolver
	calls atomic.Int64
}

func (c *countingResolver) Resolve(ctx context.Context, token string, want verifier.SubjectKind) (verifier.Subject, error) {
	c.calls.Add(1)
	return c.Resolver.Resolve(ctx, token, want)
}

// With the overlap, a request with a bad signature has its token verified
// (that is the overlap) and is still dropped unanswered; without it the token
// is never looked at.
func TestOverlapVerifiesTokenButRequestDecides(t *testing.T) {
	f := newFixture(t)
	tok := f.token(t, "node-o", 0)
	for _, tc := range []struct {
		overlap   int
		wantCalls int64
	}{{overlapAlways, 1}, {overlapNever, 0}} {
		res := &countingResolver{Resolver: f.resolver}
		r := f.responder(t, false, func(c *Config) { c.Resolver = res })
		r.overlap = tc.overlap
		_, req := f.request(t, tok, nil)
		forged := req[:len(req)-4] + "AAAA"
		resp, ev := r.Answer(t.Context(), "", []byte(forged))
		if resp != nil || ev.Outcome != OutcomeDropped || ev.Reason != DropInvalid {
			t.Fatalf("overlap=%d: resp=%d bytes, event %s/%s, want dropped/%s", tc.overlap, len(resp), ev.Outcome, ev.Reason, DropInvalid)
		}
		if got := res.calls.Load(); got != tc.wantCalls {
			t.Fatalf("overlap=%d: %d token verifications, want %d", tc.overlap, got, tc.wantCalls)
		}
		// The genuine request is answered on either path, with the Runner.
		resp, ev = r.Answer(t.Context(), "", []byte(req))
		if resp == nil || ev.Outcome != OutcomeAuthorized || ev.RunnerID != "prod/node-o" {
			t.Fatalf("overlap=%d: genuine request: %s (%s) runner %q", tc.overlap, ev.Outcome, ev.Reason, ev.RunnerID)
		}
		if got := f.open(t, resp, false); got.Jwt == "" || got.Error != "" {
			t.Fatalf("overlap=%d: answer has no user JWT (error %q)", tc.overlap, got.Error)
		}
	}
}

// spareCPU overlaps only while fewer requests are in hand than CPUs.
func TestSpareCPUFollowsRequestsInHand(t *testing.T) {
	f := newFixture(t)
	r := f.responder(t, false, func(c *Config) { c.Workers = 64 })
	if !r.spareCPU() {
		t.Fatal("idle responder: want overlap")
	}
	for range 64 {
		r.slots <- struct{}{}
	}
	if r.spareCPU() {
		t.Fatal("every worker busy: want no overlap")
	}
}

// FuzzAnswer feeds arbitrary request bytes to Answer on both paths. Whatever
// comes in, nothing is answered that nats-io/jwt does not itself decode and
// verify as an authorization request, and nothing panics.
func FuzzAnswer(f *testing.F) {
	fx := newFixture(f)
	tok := fx.token(f, "node-f", 0)
	_, genuine := fx.request(f, tok, func(c *jwt.AuthorizationRequestClaims) { c.Expires = time.Now().Add(time.Hour).Unix() })
	f.Add([]byte(genuine), true)
	f.Add([]byte(genuine[:len(genuine)-4]+"AAAA"), false)
	f.Add([]byte("a.b.c"), true)
	f.Add([]byte("e30.e30.e30"), false)
	res := &countingResolver{Resolver: fx.resolver}
	rs := map[bool]*Responder{}
	for _, overlap := range []bool{false, true} {
		r := fx.responder(f, false, func(c *Config) { c.Resolver = res })
		r.overlap = overlapNever
		if overlap {
			r.overlap = overlapAlways
		}
		rs[overlap] = r
	}
	f.Fuzz(func(t *testing.T, data []byte, overlap bool) {
		r := rs[overlap]
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
