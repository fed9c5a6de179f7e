package callout

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/curve25519"
	"golang.org/x/crypto/nacl/box"
)

// XKey is the callout's curve25519 key (the private half of the xkey in the
// server's auth_callout block or the callout account's authorization). It
// seals and opens in the nkeys "xkv1" format, byte-compatible with
// nkeys.KeyPair.Seal/Open, but keeps the shared key computed with each server
// xkey: nkeys recomputes it (a curve25519 scalar multiplication) on every
// Seal and every Open, twice per sealed request.
type XKey struct {
	seed [32]byte
	pub  string

	mu     sync.RWMutex
	shared map[string]*[32]byte // by server xkey
}

// maxSharedKeys bounds the cache of per-server shared keys. A deployment has
// one xkey per nats-server process (regenerated at each start); past this many
// the cache is cleared rather than grown, so a flood of forged header xkeys
// cannot grow memory.
const maxSharedKeys = 1024

const (
	xkeyVersion  = nkeys.XKeyVersionV1
	xkeyNonceLen = 24
)

// Errors from sealing and opening. They never contain key material.
var (
	ErrBadXKeySeed = errors.New("callout: not a valid xkey (curve) seed")
	errBadSender   = errors.New("callout: xkey: not a curve public key")
	errOpen        = errors.New("callout: xkey: could not decrypt")
)

// NewXKey decodes an encoded curve seed ("SX...").
func NewXKey(seed []byte) (*XKey, error) {
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil || prefix != nkeys.PrefixByteCurve || len(raw) != 32 {
		return nil, ErrBadXKeySeed
	}
	x := &XKey{shared: map[string]*[32]byte{}}
	copy(x.seed[:], raw)
	var pub [32]byte
	curve25519.ScalarBaseMult(&pub, &x.seed)
	enc, err := nkeys.Encode(nkeys.PrefixByteCurve, pub[:])
	if err != nil {
		return nil, ErrBadXKeySeed
	}
	x.pub = string(enc)
	return x, nil
}

// GenerateXKey returns an XKey for a fresh curve key, from crypto/rand: for
// dev mode and tests, where the server is configured in the same process.
func GenerateXKey() (*XKey, error) {
	kp, err := nkeys.CreateCurveKeys()
	if err != nil {
		return nil, fmt.Errorf("callout: generate a curve key: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("callout: generate a curve key: %w", err)
	}
	return NewXKey(seed)
}

// ReadXKey reads a curve seed from a file (a bare seed, or the first seed line).
func ReadXKey(path string) (*XKey, error) {
	seed, err := readSeedFile(path)
	if err != nil {
		return nil, err
	}
	x, err := NewXKey(seed)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return x, nil
}

// Public is the public xkey ("X..."), the value for the server's xkey setting.
func (x *XKey) Public() string { return x.pub }

// String never prints the seed.
func (x *XKey) String() string { return "callout.XKey(" + x.pub + ")" }

func (x *XKey) sharedKey(peer string) (*[32]byte, error) {
	x.mu.RLock()
	k := x.shared[peer]
	x.mu.RUnlock()
	if k != nil {
		return k, nil
	}
	if !nkeys.IsValidPublicCurveKey(peer) {
		return nil, errBadSender
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteCurve, []byte(peer))
	if err != nil || len(raw) != 32 {
		return nil, errBadSender
	}
	var pub [32]byte
	copy(pub[:], raw)
	k = new([32]byte)
	box.Precompute(k, &pub, &x.seed)
	x.mu.Lock()
	if len(x.shared) >= maxSharedKeys {
		clear(x.shared)
	}
	x.shared[peer] = k
	x.mu.Unlock()
	return k, nil
}

// Open decrypts a message sealed by sender (a public xkey) to this key.
func (x *XKey) Open(msg []byte, sender string) ([]byte, error) {
	if len(msg) <= len(xkeyVersion)+xkeyNonceLen || !bytes.HasPrefix(msg, []byte(xkeyVersion)) {
		return nil, errOpen
	}
	k, err := x.sharedKey(sender)
	if err != nil {
		return nil, err
	}
	var nonce [xkeyNonceLen]byte
	copy(nonce[:], msg[len(xkeyVersion):])
	out, ok := box.OpenAfterPrecomputation(nil, msg[len(xkeyVersion)+xkeyNonceLen:], &nonce, k)
	if !ok {
		return nil, errOpen
	}
	return out, nil
}

// Seal encrypts msg to recipient (a public xkey) with a random nonce.
func (x *XKey) Seal(msg []byte, recipient string) ([]byte, error) {
	return x.sealWithRand(msg, recipient, rand.Reader)
}

func (x *XKey) sealWithRand(msg []byte, recipient string, rr io.Reader) ([]byte, error) {
	k, err := x.sharedKey(recipient)
	if err != nil {
		return nil, err
	}
	var nonce [xkeyNonceLen]byte
	if _, err := io.ReadFull(rr, nonce[:]); err != nil {
		return nil, fmt.Errorf("callout: xkey: nonce: %w", err)
	}
	out := make([]byte, 0, len(xkeyVersion)+xkeyNonceLen+box.Overhead+len(msg))
	out = append(out, xkeyVersion...)
	out = append(out, nonce[:]...)
	return box.SealAfterPrecomputation(out, msg, &nonce, k), nil
}
