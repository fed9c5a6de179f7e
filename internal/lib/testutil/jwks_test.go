package testutil

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FailingJWKS answers 503 to the key set while failing, and passes it, and
// every other path, to the handler it wraps otherwise; it counts what it
// failed.
func TestFailingJWKSFailsTheKeySetWhileSwitchedOn(t *testing.T) {
	f := NewFailingJWKS(true)
	h := f.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "served "+r.URL.Path)
	}))
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://issuer.test"+path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, step := range []struct {
		name    string
		failing bool
		path    string
		code    int
		failed  int64
	}{
		{"key set, failing", true, "/openid/v1/jwks", http.StatusServiceUnavailable, 1},
		{"discovery, failing", true, "/.well-known/openid-configuration", http.StatusOK, 1},
		{"another key set path, failing", true, "/keys/jwks", http.StatusServiceUnavailable, 2},
		{"key set, switched off", false, "/openid/v1/jwks", http.StatusOK, 2},
		{"key set, switched on again", true, "/openid/v1/jwks", http.StatusServiceUnavailable, 3},
	} {
		f.SetFailing(step.failing)
		code, body := get(step.path)
		if code != step.code {
			t.Fatalf("%s: %d %q, want %d", step.name, code, body, step.code)
		}
		if code == http.StatusOK && body != "served "+step.path {
			t.Fatalf("%s: body %q, not the wrapped handler's", step.name, body)
		}
		if got := f.Failed(); got != step.failed {
			t.Fatalf("%s: Failed() = %d, want %d", step.name, got, step.failed)
		}
	}
	if NewFailingJWKS(false).failing.Load() {
		t.Fatal("NewFailingJWKS(false) fails from the start")
	}
}
