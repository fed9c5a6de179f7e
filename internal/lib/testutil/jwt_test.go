package testutil

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
)

// ResignJWT keeps the header, applies the edit, names the new key as iss
// and signs with it: the signature verifies under that key.
func TestResignJWTSignsTheEditedPayloadWithTheKey(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	tok := enc([]byte(`{"typ":"JWT","alg":"ed25519-nkey"}`)) + "." + enc([]byte(`{"iss":"AOLD","sub":"x"}`)) + "." + enc([]byte("sig"))
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	got := ResignJWT(t, tok, kp, func(m map[string]any) { m["sub"] = "y" })
	parts := strings.Split(got, ".")
	if len(parts) != 3 || parts[0] != strings.Split(tok, ".")[0] {
		t.Fatalf("header not kept: %q", got)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m["iss"] != pub || m["sub"] != "y" {
		t.Fatalf("payload %v, want iss %s and the edit", m, pub)
	}
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	raw32, err := nkeys.Decode(nkeys.PrefixByteAccount, []byte(pub))
	if err != nil {
		t.Fatal(err)
	}
	if !ed25519.Verify(ed25519.PublicKey(raw32), []byte(parts[0]+"."+parts[1]), sig) {
		t.Fatal("the signature does not verify under the key")
	}
}
