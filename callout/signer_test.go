package callout

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

func newAccountSigner(t testing.TB) (*Signer, nkeys.KeyPair) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	s, err := NewSigner(seed, nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	return s, kp
}

func TestSignerMatchesNkeys(t *testing.T) {
	s, kp := newAccountSigner(t)
	pub, _ := kp.PublicKey()
	if s.Public() != pub {
		t.Fatalf("public key %s, nkeys says %s", s.Public(), pub)
	}
	msg := []byte("compass")
	sig, err := s.Sign(msg)
	if err != nil {
		t.Fatal(err)
	}
	if err := kp.Verify(msg, sig); err != nil {
		t.Fatalf("nkeys does not verify the Signer's signature: %v", err)
	}
	want, _ := kp.Sign(msg)
	if !bytes.Equal(sig, want) { // ed25519 is deterministic
		t.Fatal("signature differs from nkeys'")
	}
	if err := s.Verify(msg, sig); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify([]byte("other"), sig); !errors.Is(err, nkeys.ErrInvalidSignature) {
		t.Fatalf("Verify(other) = %v, want ErrInvalidSignature", err)
	}
	// A JWT encoded with the Signer decodes (signature and issuer checked).
	u, _ := nkeys.CreateUser()
	upub, _ := u.PublicKey()
	uc := jwt.NewUserClaims(upub)
	tok, err := uc.Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got.Issuer != pub {
		t.Fatalf("issuer %s, want %s", got.Issuer, pub)
	}
}

func TestSignerRefusesWrongSeeds(t *testing.T) {
	user, _ := nkeys.CreateUser()
	useed, _ := user.Seed()
	curve, _ := nkeys.CreateCurveKeys()
	cseed, _ := curve.Seed()
	acct := nkeys.PrefixByteAccount
	for _, tc := range []struct {
		name    string
		seed    []byte
		allowed []nkeys.PrefixByte
		want    string // "" when accepted
	}{
		{"garbage", []byte("SAnotaseed"), []nkeys.PrefixByte{acct}, "callout: not a valid nkey seed"},
		{"user seed where account wanted", useed, []nkeys.PrefixByte{acct}, "callout: not a valid nkey seed: a user seed where account is expected"},
		{"curve seed", cseed, []nkeys.PrefixByte{acct}, "callout: not a valid nkey seed: a curve (xkey) seed cannot sign"},
		{"curve seed, any type allowed", cseed, nil, "callout: not a valid nkey seed: a curve (xkey) seed cannot sign"},
		{"user seed, any type allowed", useed, nil, ""},
		{"user seed among those allowed", useed, []nkeys.PrefixByte{acct, nkeys.PrefixByteUser}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSigner(tc.seed, tc.allowed...)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err = %v, want the seed accepted", err)
				}
				return
			}
			if !errors.Is(err, ErrBadSeed) || err.Error() != tc.want {
				t.Fatalf("err = %v, want %q (ErrBadSeed)", err, tc.want)
			}
			if strings.Contains(err.Error(), string(tc.seed)) {
				t.Fatal("error quotes the seed")
			}
		})
	}
}

func TestSignerNeverPrintsSeed(t *testing.T) {
	s, kp := newAccountSigner(t)
	seed, _ := kp.Seed()
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if out := fmt.Sprintf(f, s); strings.Contains(out, string(seed)) || strings.Contains(out, string(seed[2:20])) {
			t.Fatalf("%s prints the seed", f)
		}
	}
}

func TestReadSignerFromCredsStyleFile(t *testing.T) {
	_, kp := newAccountSigner(t)
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	dir := t.TempDir()
	path := filepath.Join(dir, "issuer.nk")
	content := "-----BEGIN ACCOUNT NKEY SEED-----\n" + string(seed) + "\n------END ACCOUNT NKEY SEED------\n"
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := ReadSigner(path, nkeys.PrefixByteAccount)
	if err != nil {
		t.Fatal(err)
	}
	if s.Public() != pub {
		t.Fatal("wrong key read")
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, []byte("nothing here\n"), 0o600)
	if _, err := ReadSigner(empty); !errors.Is(err, ErrBadSeed) {
		t.Fatalf("err = %v, want ErrBadSeed", err)
	}
}

func TestXKeyInteroperatesWithNkeys(t *testing.T) {
	ours, _ := nkeys.CreateCurveKeys()
	oseed, _ := ours.Seed()
	x, err := NewXKey(oseed)
	if err != nil {
		t.Fatal(err)
	}
	opub, _ := ours.PublicKey()
	if x.Public() != opub {
		t.Fatal("public xkey differs from nkeys'")
	}
	server, _ := nkeys.CreateCurveKeys()
	spub, _ := server.PublicKey()

	sealed, err := server.Seal([]byte("request"), opub)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // second time from the cached shared key
		got, err := x.Open(sealed, spub)
		if err != nil || string(got) != "request" {
			t.Fatalf("Open = %q, %v", got, err)
		}
	}
	answer, err := x.Seal([]byte("response"), spub)
	if err != nil {
		t.Fatal(err)
	}
	got, err := server.Open(answer, opub)
	if err != nil || string(got) != "response" {
		t.Fatalf("nkeys Open = %q, %v", got, err)
	}
	// Sealed by someone else: refused.
	other, _ := nkeys.CreateCurveKeys()
	otherPub, _ := other.PublicKey()
	forged, _ := other.Seal([]byte("request"), opub)
	if _, err := x.Open(forged, spub); !errors.Is(err, errOpen) {
		t.Fatalf("Open(forged) = %v, want errOpen", err)
	}
	if _, err := x.Open(sealed, "Xnotakey"); !errors.Is(err, errBadSender) {
		t.Fatalf("Open(bad sender) = %v, want errBadSender", err)
	}
	_ = otherPub
	if _, err := NewXKey([]byte("SXgarbage")); !errors.Is(err, ErrBadXKeySeed) {
		t.Fatalf("NewXKey(garbage) = %v", err)
	}
}

func TestUserExpiry(t *testing.T) {
	now := time.Unix(1_800_000_000, 400_000_000) // .4 s into a second
	max := 10 * time.Minute
	for _, tc := range []struct {
		name     string
		notAfter time.Time
		want     time.Time
		err      error
	}{
		{"minted token gets the maximum", time.Time{}, time.Unix(now.Unix()+600, 0), nil},
		{"token outliving the cap is capped", now.Add(time.Hour), time.Unix(now.Unix()+600, 0), nil},
		{"user JWT ends with the token", now.Add(90*time.Second + 300*time.Millisecond), time.Unix(now.Unix()+90, 0), nil},
		{"bound passed a second ago", now.Add(-time.Second), time.Time{}, errTokenOver},
		{"bound exactly now", now, time.Time{}, errTokenOver},
		{"token ending within the second", now.Add(500 * time.Millisecond), time.Time{}, errTokenEnding},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := UserExpiry(now, tc.notAfter, max)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if !got.Equal(tc.want) {
				t.Fatalf("exp = %v, want %v", got, tc.want)
			}
			if err == nil && !tc.notAfter.IsZero() && got.After(tc.notAfter) {
				t.Fatal("user JWT outlives the bound")
			}
		})
	}
}

// GenerateSigner and GenerateXKey make fresh keys of the asked type, each
// different, each a working key pair whose seed reads back as the same key.
func TestGenerateKeys(t *testing.T) {
	for _, prefix := range []nkeys.PrefixByte{nkeys.PrefixByteAccount, nkeys.PrefixByteOperator, nkeys.PrefixByteUser} {
		a, err := GenerateSigner(prefix)
		if err != nil {
			t.Fatal(err)
		}
		b, err := GenerateSigner(prefix)
		if err != nil {
			t.Fatal(err)
		}
		if a.Public() == b.Public() {
			t.Fatalf("%s: two generated keys are the same", prefix)
		}
		if p := nkeys.Prefix(a.Public()); p != prefix {
			t.Fatalf("%s: generated a %s key", prefix, p)
		}
		seed, err := a.Seed()
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			t.Fatal(err)
		}
		sig, err := a.Sign([]byte("input"))
		if err != nil {
			t.Fatal(err)
		}
		if err := kp.Verify([]byte("input"), sig); err != nil {
			t.Fatalf("%s: nkeys does not verify the generated key's signature: %v", prefix, err)
		}
	}
	if _, err := GenerateSigner(nkeys.PrefixByteCurve); !errors.Is(err, ErrBadSeed) {
		t.Fatalf("GenerateSigner(curve) = %v, want ErrBadSeed", err)
	}

	x, err := GenerateXKey()
	if err != nil {
		t.Fatal(err)
	}
	y, err := GenerateXKey()
	if err != nil {
		t.Fatal(err)
	}
	if x.Public() == y.Public() || !nkeys.IsValidPublicCurveKey(x.Public()) {
		t.Fatalf("generated xkeys %s and %s: want two different curve keys", x.Public(), y.Public())
	}
	sealed, err := x.Seal([]byte("request"), y.Public())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := y.Open(sealed, x.Public()); err != nil || string(got) != "request" {
		t.Fatalf("Open = %q, %v", got, err)
	}
}
