package tokenreview_test

import (
	"testing"
	"time"
)

// BenchmarkReview: an answer from the cache, and one that is a request to a
// TLS test server on loopback (notAfter zero caches nothing). The live tier's
// BenchmarkLiveTokenReview measures the request to a real kube-apiserver.
func BenchmarkReview(b *testing.B) {
	f := newFakeAPI(b)
	r := f.reviewer(b)
	ctx := b.Context()
	b.Run("cached", func(b *testing.B) {
		notAfter := time.Now().Add(time.Hour)
		if _, err := r.Review(ctx, "ok-cached", notAfter); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Review(ctx, "ok-cached", notAfter); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("request", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Review(ctx, "ok-request", time.Time{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
