package callout

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nkeys"
)

// Signer is an nkeys.KeyPair for an ed25519 nkey (account, operator, server or
// user) that derives the ed25519 key from the seed once.
//
// nkeys' own key pair keeps only the encoded seed and re-derives the key (a
// SHA-512 and a scalar multiplication) on every Sign and PublicKey; encoding one
// JWT calls both, and a callout request encodes two JWTs. Keeping the derived
// key removes that work from every request (see BenchmarkRequestCost).
//
// A Signer is immutable and safe for concurrent use. It never prints its seed.
type Signer struct {
	prefix nkeys.PrefixByte
	pub    string
	priv   ed25519.PrivateKey
	seed   []byte // encoded seed, for Seed()
}

var _ nkeys.KeyPair = (*Signer)(nil)

// ErrBadSeed is returned for a seed that is not an nkey seed of an allowed type.
// Its message never contains the seed.
var ErrBadSeed = errors.New("callout: not a valid nkey seed")

// NewSigner decodes an encoded nkey seed ("SA...", "SO...", ...). allowed lists
// the key types accepted (nkeys.PrefixByteAccount, ...); none means any
// ed25519 type.
func NewSigner(seed []byte, allowed ...nkeys.PrefixByte) (*Signer, error) {
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, ErrBadSeed
	}
	if prefix == nkeys.PrefixByteCurve || len(raw) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: a curve (xkey) seed cannot sign", ErrBadSeed)
	}
	if len(allowed) > 0 {
		ok := false
		for _, p := range allowed {
			ok = ok || p == prefix
		}
		if !ok {
			return nil, fmt.Errorf("%w: a %s seed where %s is expected", ErrBadSeed, prefix, prefixList(allowed))
		}
	}
	priv := ed25519.NewKeyFromSeed(raw)
	pub, err := nkeys.Encode(prefix, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, ErrBadSeed
	}
	return &Signer{prefix: prefix, pub: string(pub), priv: priv, seed: append([]byte(nil), seed...)}, nil
}

// GenerateSigner returns a Signer for a fresh nkey of the given ed25519 type
// (nkeys.PrefixByteAccount, ...), from crypto/rand: for dev mode and tests,
// where nothing outside the process holds the key.
func GenerateSigner(prefix nkeys.PrefixByte) (*Signer, error) {
	kp, err := nkeys.CreatePair(prefix)
	if err != nil {
		return nil, fmt.Errorf("callout: generate a %s key: %w", prefix, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("callout: generate a %s key: %w", prefix, err)
	}
	return NewSigner(seed, prefix)
}

// ReadSigner reads a seed from a file: either a bare seed or a .creds/.nk file
// holding one (the first line that decodes as a seed is used).
func ReadSigner(path string, allowed ...nkeys.PrefixByte) (*Signer, error) {
	seed, err := readSeedFile(path)
	if err != nil {
		return nil, err
	}
	s, err := NewSigner(seed, allowed...)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return s, nil
}

// readSeedFile returns the first seed-looking line of a file. Errors name the
// file, never its content.
func readSeedFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("callout: seed file: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if len(line) > 2 && line[0] == 'S' {
			if _, _, err := nkeys.DecodeSeed([]byte(line)); err == nil {
				return []byte(line), nil
			}
		}
	}
	return nil, fmt.Errorf("%w: no seed in %s", ErrBadSeed, path)
}

func prefixList(ps []nkeys.PrefixByte) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " or ")
}

// Prefix is the key type.
func (s *Signer) Prefix() nkeys.PrefixByte { return s.prefix }

// Public is the encoded public key ("A...", "O...").
func (s *Signer) Public() string { return s.pub }

// PublicKey implements nkeys.KeyPair.
func (s *Signer) PublicKey() (string, error) { return s.pub, nil }

// Seed implements nkeys.KeyPair. It returns a copy.
func (s *Signer) Seed() ([]byte, error) { return append([]byte(nil), s.seed...), nil }

// PrivateKey implements nkeys.KeyPair.
func (s *Signer) PrivateKey() ([]byte, error) {
	return nkeys.Encode(nkeys.PrefixBytePrivate, s.priv)
}

// Sign implements nkeys.KeyPair with the kept ed25519 key.
func (s *Signer) Sign(input []byte) ([]byte, error) { return ed25519.Sign(s.priv, input), nil }

// Verify implements nkeys.KeyPair.
func (s *Signer) Verify(input, sig []byte) error {
	if !ed25519.Verify(s.priv.Public().(ed25519.PublicKey), input, sig) {
		return nkeys.ErrInvalidSignature
	}
	return nil
}

// Wipe implements nkeys.KeyPair. A wiped Signer must not be used. It exists for
// the interface; a Signer is meant to live as long as the process.
func (s *Signer) Wipe() {
	_, _ = io.ReadFull(rand.Reader, s.priv)
	_, _ = io.ReadFull(rand.Reader, s.seed)
}

// Seal, SealWithRand and Open are curve-key operations; a Signer is an
// ed25519 key (see XKey).
func (s *Signer) Seal([]byte, string) ([]byte, error) { return nil, nkeys.ErrInvalidNKeyOperation }

// SealWithRand: see Seal.
func (s *Signer) SealWithRand([]byte, string, io.Reader) ([]byte, error) {
	return nil, nkeys.ErrInvalidNKeyOperation
}

// Open: see Seal.
func (s *Signer) Open([]byte, string) ([]byte, error) { return nil, nkeys.ErrInvalidNKeyOperation }

// String never prints the seed.
func (s *Signer) String() string { return "callout.Signer(" + s.pub + ")" }

// GoString never prints the seed (for %#v).
func (s *Signer) GoString() string { return s.String() }
