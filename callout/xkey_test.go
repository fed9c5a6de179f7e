package callout

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

func newTestXKey(t *testing.T) (*XKey, []byte) {
	t.Helper()
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewXKey(seed)
	if err != nil {
		t.Fatal(err)
	}
	return x, seed
}

// A seed of another kind of nkey is no xkey, however well formed.
func TestNewXKeyRefusesOtherSeeds(t *testing.T) {
	for _, create := range []func() (nkeys.KeyPair, error){nkeys.CreateAccount, nkeys.CreateUser, nkeys.CreateServer} {
		kp, _ := create()
		seed, _ := kp.Seed()
		if _, err := NewXKey(seed); !errors.Is(err, ErrBadXKeySeed) {
			t.Fatalf("NewXKey(%c seed) = %v, want %v", seed[1], err, ErrBadXKeySeed)
		}
	}
}

// Open refuses what cannot be a sealed message before it looks at the
// sender: too short for the version and nonce, or without the version.
func TestXKeyOpenRefusesMalformed(t *testing.T) {
	x, _ := newTestXKey(t)
	for _, msg := range [][]byte{
		nil,
		[]byte(xkeyVersion),
		[]byte(xkeyVersion + "12345"),
		[]byte(xkeyVersion + strings.Repeat("n", xkeyNonceLen)),
		[]byte("xkv0" + strings.Repeat("n", xkeyNonceLen+64)),
	} {
		// The sender is no key at all: the message is refused first.
		if _, err := x.Open(msg, "not-a-key"); !errors.Is(err, errOpen) {
			t.Fatalf("Open(%d bytes) = %v, want %v", len(msg), err, errOpen)
		}
	}
}

// The shared-key cache keeps a key per peer and never holds more than
// maxSharedKeys: the next peer past it starts it over.
func TestXKeySharedKeyCacheBounded(t *testing.T) {
	x, _ := newTestXKey(t)
	peers := make([]string, maxSharedKeys+1)
	for i := range peers {
		p, _ := newTestXKey(t)
		peers[i] = p.Public()
	}
	for i, p := range peers[:2] {
		if _, err := x.Seal([]byte("m"), p); err != nil {
			t.Fatal(err)
		}
		if n := len(x.shared); n != i+1 {
			t.Fatalf("after %d peers the cache holds %d keys", i+1, n)
		}
	}
	for _, p := range peers[2:maxSharedKeys] {
		if _, err := x.Seal([]byte("m"), p); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(x.shared); n != maxSharedKeys {
		t.Fatalf("after %d peers the cache holds %d keys", maxSharedKeys, n)
	}
	if _, err := x.Seal([]byte("m"), peers[maxSharedKeys]); err != nil {
		t.Fatal(err)
	}
	if n := len(x.shared); n != 1 {
		t.Fatalf("one peer past the bound: the cache holds %d keys, want 1 (started over)", n)
	}
}

// String names the public key and never the seed.
func TestXKeyStringShowsNoSeed(t *testing.T) {
	x, seed := newTestXKey(t)
	want := "callout.XKey(" + x.Public() + ")"
	for _, got := range []string{x.String(), fmt.Sprint(x), fmt.Sprintf("%v %s", x, x)} {
		if !strings.Contains(got, want) || strings.Contains(got, string(seed)) {
			t.Fatalf("printed as %q, want %q and no seed", got, want)
		}
	}
}
