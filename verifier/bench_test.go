package verifier

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"math/big"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/kubeissuer"
)

// BenchmarkVerify measures Verify next to go-jose's bare signature check of
// the same token, so everything Verify adds (header checks, issuer and key
// selection, claim checks) reads as a ratio: Verify/<alg> ÷ BareJOSE/<alg>.
// Signature/<alg> is the signature check alone, crypto/rsa or crypto/ecdsa on
// the token's signing input: the floor under any verification of the token,
// whatever does the JOSE around it (it is here to be measured, not used).
func BenchmarkVerify(b *testing.B) {
	for _, alg := range []kubeissuer.Alg{kubeissuer.RS256, kubeissuer.ES256} {
		is, err := kubeissuer.New(kubeissuer.Options{Alg: alg})
		if err != nil {
			b.Fatal(err)
		}
		caFile, err := is.WriteCAFileIn(b.TempDir(), "bench")
		if err != nil {
			b.Fatal(err)
		}
		// The same token again and again: without the cache every call is a
		// full verification; with it, every call after the first is a hit.
		rcs := []RunnerCluster{{Name: "bench", Issuer: is.URL(), CAFile: caFile}}
		v, err := New(rcs, WithVerifiedCache(0))
		if err != nil {
			b.Fatal(err)
		}
		cached, err := New(rcs)
		if err != nil {
			b.Fatal(err)
		}
		for _, v := range []*RunnerVerifier{v, cached} {
			if err := v.Refresh(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		tok, err := is.Token(kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal"}, 0)
		if err != nil {
			b.Fatal(err)
		}
		sk := is.SigningKey()
		pub := sk.Public()
		b.Run("Signature/"+string(alg), func(b *testing.B) {
			b.ReportAllocs()
			dot := strings.LastIndexByte(tok, '.')
			sig, err := base64.RawURLEncoding.DecodeString(tok[dot+1:])
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				h := sha256.Sum256([]byte(tok[:dot]))
				var ok bool
				switch k := pub.Key.(type) {
				case *rsa.PublicKey:
					ok = rsa.VerifyPKCS1v15(k, crypto.SHA256, h[:], sig) == nil
				case *ecdsa.PublicKey:
					r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
					ok = ecdsa.Verify(k, h[:], r, s)
				}
				if !ok {
					b.Fatal("signature does not verify")
				}
			}
		})
		b.Run("BareJOSE/"+string(alg), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				jws, err := jose.ParseSignedCompact(tok, allowedAlgs)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := jws.Verify(pub.Key); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("Verify/"+string(alg), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				if _, err := v.Verify(ctx, tok); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("VerifyCached/"+string(alg), func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				if _, err := cached.Verify(ctx, tok); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("VerifyParallel/"+string(alg), func(b *testing.B) {
			ctx := context.Background()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := v.Verify(ctx, tok); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		is.Close()
	}
}
