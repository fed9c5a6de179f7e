package callout

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// threadCPU is the calling OS thread's CPU time. Benchmarks lock their
// goroutine to a thread and report CPU per operation besides wall time: on a
// shared machine wall time also counts the time other processes hold the CPU.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuMeter reports cpu-µs/op for the benchmark loop it brackets.
func cpuMeter(b *testing.B) func() {
	runtime.LockOSThread()
	start := threadCPU()
	return func() {
		b.ReportMetric(float64(threadCPU()-start)/float64(b.N)/1e3, "cpu-µs/op")
		runtime.UnlockOSThread()
	}
}

// BenchmarkRequestCost is the protocol work of one callout request without
// token verification: decode the server's request, encode a user JWT and
// encode the response. "nkeys" signs with nkeys' key pair (which re-derives
// the ed25519 key from the seed on every Sign and PublicKey), "signer" with
// Signer, which keeps the derived key.
func BenchmarkRequestCost(b *testing.B) {
	f := newFixture(b)
	_, req := f.request(b, "token", nil)
	seed, _ := f.signer.Seed()
	naive, _ := nkeys.FromSeed(seed)
	perms, _ := RunnerPermissions("prod/node")
	for _, tc := range []struct {
		name string
		kp   nkeys.KeyPair
	}{{"nkeys", naive}, {"signer", f.signer}} {
		b.Run(tc.name, func(b *testing.B) {
			defer cpuMeter(b)()
			for b.Loop() {
				rc, err := jwt.DecodeAuthorizationRequestClaims(req)
				if err != nil {
					b.Fatal(err)
				}
				uc := jwt.NewUserClaims(rc.UserNkey)
				uc.Name = "prod/node"
				uc.Audience = "RUNNERS"
				uc.Expires = time.Now().Add(time.Minute).Unix()
				uc.Permissions = perms
				ujwt, err := uc.Encode(tc.kp)
				if err != nil {
					b.Fatal(err)
				}
				resp := jwt.NewAuthorizationResponseClaims(rc.UserNkey)
				resp.Audience = rc.Server.ID
				resp.Jwt = ujwt
				if _, err := resp.Encode(tc.kp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkXKey compares nkeys' Open+Seal (a curve25519 multiplication each)
// with XKey's, which keeps the shared key per server.
func BenchmarkXKey(b *testing.B) {
	f := newFixture(b)
	_, req := f.request(b, "token", nil)
	ck, _ := nkeys.CreateCurveKeys()
	cseed, _ := ck.Seed()
	ours, _ := NewXKey(cseed)
	sealedToCK, _ := f.serverX.Seal([]byte(req), ours.Public())
	b.Run("nkeys", func(b *testing.B) {
		defer cpuMeter(b)()
		for b.Loop() {
			msg, err := ck.Open(sealedToCK, f.serverXP)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ck.Seal(msg, f.serverXP); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("xkey", func(b *testing.B) {
		defer cpuMeter(b)()
		for b.Loop() {
			msg, err := ours.Open(sealedToCK, f.serverXP)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ours.Seal(msg, f.serverXP); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAnswer is one full request as compass-callout handles it:
// open (xkey), decode and check the request, verify a distinct RS256 projected
// token through the shared verifier, issue and validate the user JWT, encode
// and seal the response.
func BenchmarkAnswer(b *testing.B) {
	f := newFixture(b)
	// The verified-token cache off: the loop comes back to each token, and
	// every request must be verified in full, as a Runner's first connect is.
	v := verifiertest.New(b, "tenant", []verifier.RunnerCluster{verifiertest.Cluster(b, f.issuer, "prod")}, verifier.WithVerifiedCache(0))
	f.resolver = verifier.NewResolver(v, nil)
	const pool = 512 // distinct tokens and requests, so nothing is cached by content
	for _, sealed := range []bool{false, true} {
		b.Run(fmt.Sprintf("sealed=%v", sealed), func(b *testing.B) {
			r := f.responder(b, sealed, nil)
			reqs := make([][]byte, pool)
			for i := range reqs {
				_, req := f.request(b, f.token(b, fmt.Sprintf("node-%d", i), 0), func(c *jwt.AuthorizationRequestClaims) {
					c.Expires = time.Now().Add(time.Hour).Unix()
				})
				reqs[i] = []byte(req)
				if sealed {
					reqs[i] = f.seal(b, req)
				}
			}
			hdr := ""
			if sealed {
				hdr = f.serverXP
			}
			i := 0
			defer cpuMeter(b)()
			for b.Loop() {
				// The replay set would refuse a request seen before.
				clear(r.replay)
				resp, ev := r.Answer(b.Context(), hdr, reqs[i%pool])
				if resp == nil {
					b.Fatalf("%s: %s", ev.Outcome, ev.Reason)
				}
				i++
			}
		})
	}
	if hits, _ := v.CacheStats(); hits != 0 {
		b.Fatalf("%d requests answered from the verified-token cache; each must be verified in full", hits)
	}
}
