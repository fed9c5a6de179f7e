package testutil

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// NKeySigner is what ResignJWT needs of a key: an nkeys.KeyPair has it.
type NKeySigner interface {
	Sign([]byte) ([]byte, error)
	PublicKey() (string, error)
}

// ResignJWT is tok with its payload passed through edit (when not nil), its
// iss set to kp's public key, and signed by kp: a forgery by a key the
// jwt package would refuse to sign with, for the tests that check such a
// token or request is refused.
func ResignJWT(t testing.TB, tok string, kp NKeySigner, edit func(map[string]any)) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %d parts", len(parts))
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(m)
	}
	if m["iss"], err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	signing := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload)
	sig, err := kp.Sign([]byte(signing))
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}
