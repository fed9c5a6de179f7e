package runner

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/atomicfile"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// newClock is the tests' injected clock, at a fixed instant.
func newClock() *testutil.Clock { return testutil.NewClock(time.Unix(1_900_000_000, 0)) }

// signedToken signs a JWT whose exp is exp (none when zero), like a projected
// token as far as the Runner cares (it never verifies).
func signedToken(t *testing.T, exp time.Time) string {
	t.Helper()
	key, err := kubeissuer.NewKey(kubeissuer.ES256)
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{"iss": "https://issuer.test", "sub": "system:serviceaccount:compass-runner:compass-runner", "aud": []string{"compass-runner"}}
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
		claims["iat"] = exp.Add(-600 * time.Second).Unix()
	}
	tok, err := kubeissuer.SignWith(key, claims, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// mintedToken is an opaque minted Runner token (no exp).
func mintedToken(t *testing.T) string {
	t.Helper()
	tok, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := atomicfile.Write(path, []byte(data)); err != nil {
		t.Fatal(err)
	}
}

func newLog(t *testing.T) (*slog.Logger, *testlog.Buffer) {
	t.Helper()
	b := &testlog.Buffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// assertNoToken fails when any token appears in the log (whole or as its
// signature, the secret-bearing part).
func assertNoToken(t *testing.T, logs string, toks ...string) {
	t.Helper()
	for _, tok := range toks {
		if tok == "" {
			continue
		}
		parts := strings.Split(tok, ".")
		if strings.Contains(logs, tok) || strings.Contains(logs, parts[len(parts)-1]) {
			t.Fatalf("a token appears in the log")
		}
	}
}

func TestFileTokenRereadsFileOnEveryCall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	clk := newClock()
	a, b := signedToken(t, clk.Now().Add(10*time.Minute)), signedToken(t, clk.Now().Add(20*time.Minute))
	writeFile(t, path, a+"\n")
	src := NewFileToken(path, slog.New(slog.DiscardHandler), clk.Now)
	got, err := src.Token()
	if err != nil || got != a {
		t.Fatalf("first Token: err %v, matches first token %v", err, got == a)
	}
	writeFile(t, path, "  "+b+"\r\n")
	got, err = src.Token()
	if err != nil || got != b {
		t.Fatalf("after rewrite: err %v, matches second token %v", err, got == b)
	}
	exp, ok := src.Expiry()
	if !ok || !exp.Equal(clk.Now().Add(20*time.Minute)) {
		t.Fatalf("Expiry = %v %v, want the second token's exp", exp, ok)
	}
}

func TestFileTokenReadErrorReturnsCachedTokenUntilExpiry(t *testing.T) {
	cases := []struct {
		name      string
		token     func(t *testing.T, now time.Time) string
		breakFile func(t *testing.T, path string)
		advance   time.Duration
		wantCache bool
	}{
		{"removed, unexpired", func(t *testing.T, now time.Time) string { return signedToken(t, now.Add(5*time.Minute)) },
			func(t *testing.T, p string) { os.Remove(p) }, 4 * time.Minute, true},
		{"emptied, unexpired", func(t *testing.T, now time.Time) string { return signedToken(t, now.Add(5*time.Minute)) },
			func(t *testing.T, p string) { writeFile(t, p, " \n") }, time.Minute, true},
		{"unreadable (a directory), unexpired", func(t *testing.T, now time.Time) string { return signedToken(t, now.Add(5*time.Minute)) },
			func(t *testing.T, p string) { os.Remove(p); os.Mkdir(p, 0o700) }, time.Minute, true},
		{"removed, expired", func(t *testing.T, now time.Time) string { return signedToken(t, now.Add(5*time.Minute)) },
			func(t *testing.T, p string) { os.Remove(p) }, 5 * time.Minute, false},
		{"removed, opaque minted token has no exp", func(t *testing.T, now time.Time) string { return mintedToken(t) },
			func(t *testing.T, p string) { os.Remove(p) }, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			clk := newClock()
			tok := tc.token(t, clk.Now())
			writeFile(t, path, tok)
			log, logs := newLog(t)
			src := NewFileToken(path, log, clk.Now)
			if got, err := src.Token(); err != nil || got != tok {
				t.Fatalf("initial read: err %v", err)
			}
			tc.breakFile(t, path)
			clk.Advance(tc.advance)
			got, err := src.Token()
			if tc.wantCache {
				if err != nil || got != tok {
					t.Fatalf("want the cached token, got err %v (match %v)", err, got == tok)
				}
				// And it fails once the cached token expires.
				clk.Advance(5 * time.Minute)
				got, err = src.Token()
			}
			if !errors.Is(err, ErrTokenUnavailable) || got != "" {
				t.Fatalf("err = %v (token returned: %v), want ErrTokenUnavailable", err, got != "")
			}
			assertNoToken(t, logs.String()+err.Error(), tok)
			if !strings.Contains(logs.String(), "no usable token left") {
				t.Fatalf("the failure is not logged:\n%s", logs)
			}
			// The file coming back ends the failure.
			writeFile(t, path+"2", tok)
			os.RemoveAll(path)
			os.Rename(path+"2", path)
			if got, err := src.Token(); err != nil || got != tok {
				t.Fatalf("after the file is back: err %v", err)
			}
		})
	}
}

func TestFileTokenFallbackIsLogged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	clk := newClock()
	tok := signedToken(t, clk.Now().Add(time.Minute))
	writeFile(t, path, tok)
	log, logs := newLog(t)
	src := NewFileToken(path, log, clk.Now)
	if _, err := src.Token(); err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	for range 3 {
		if _, err := src.Token(); err != nil {
			t.Fatal(err)
		}
	}
	out := logs.String()
	if n := strings.Count(out, "using the last good token"); n != 1 {
		t.Fatalf("fallback logged %d times, want once per failure episode:\n%s", n, out)
	}
	assertNoToken(t, out, tok)
}

func TestBothTokenSourcesFailAtStart(t *testing.T) {
	cases := []struct {
		name, static, file string
		want               error
		wantType           TokenSource
	}{
		{"both", "minted-token", "/var/run/secrets/compass/runner/token", ErrBothTokens, nil},
		{"neither", "", "", ErrNoToken, nil},
		{"blank static", " \n", "", ErrNoToken, nil},
		{"static", "minted-token", "", nil, StaticToken("")},
		{"file", "", "/var/run/secrets/compass/runner/token", nil, &FileToken{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, err := NewTokenSource(tc.static, tc.file, nil, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want != nil {
				if src != nil {
					t.Fatalf("a source was returned with an error")
				}
				if strings.Contains(err.Error(), "minted-token") {
					t.Fatalf("the error shows the token: %v", err)
				}
				return
			}
			switch tc.wantType.(type) {
			case StaticToken:
				if _, ok := src.(StaticToken); !ok {
					t.Fatalf("got %T, want StaticToken", src)
				}
			case *FileToken:
				if f, ok := src.(*FileToken); !ok || f.Path() != tc.file {
					t.Fatalf("got %T, want *FileToken for %s", src, tc.file)
				}
			}
		})
	}
}

func TestStaticToken(t *testing.T) {
	if _, err := StaticToken("").Token(); !errors.Is(err, ErrNoToken) {
		t.Fatalf("empty: err = %v", err)
	}
	tok := mintedToken(t)
	if got, err := StaticToken(tok + "\n").Token(); err != nil || got != tok {
		t.Fatalf("err %v, trimmed %v", err, got == tok)
	}
	if _, ok := StaticToken(tok).Expiry(); ok {
		t.Fatal("a minted token has an exp")
	}
}

func TestTokenExpiry(t *testing.T) {
	exp := time.Unix(1_900_000_600, 0)
	cases := []struct {
		name string
		tok  string
		want time.Time
		ok   bool
	}{
		{"jwt", signedToken(t, exp), exp, true},
		{"jwt without exp", signedToken(t, time.Time{}), time.Time{}, false},
		{"minted", mintedToken(t), time.Time{}, false},
		{"garbage payload", "a.!!!.c", time.Time{}, false},
		{"non-numeric exp", "e30.eyJleHAiOiJzb29uIn0.c", time.Time{}, false},
		{"empty", "", time.Time{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := TokenExpiry(tc.tok)
			if ok != tc.ok || !got.Equal(tc.want) {
				t.Fatalf("TokenExpiry = %v %v, want %v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
