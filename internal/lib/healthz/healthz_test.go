package healthz

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestReadyAnswersEachStateOfTheCheck(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		wantCode int
		wantBody string
	}{
		{"ready", nil, http.StatusOK, "ready\n"},
		{"one failing check", errors.New("store: unreachable"), http.StatusServiceUnavailable, "store: unreachable\n"},
		{"two failing checks", errors.Join(errors.New("nats: not connected"), errors.New("keys: none")), http.StatusServiceUnavailable, "nats: not connected\nkeys: none\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gotCtx context.Context
			h := Ready(func(ctx context.Context) error { gotCtx = ctx; return tc.err })
			req := httptest.NewRequest(http.MethodGet, "/readyz", nil)
			rec := httptest.NewRecorder()
			h(rec, req)
			res := rec.Result()
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.wantCode || string(body) != tc.wantBody {
				t.Errorf("got %d %q, want %d %q", res.StatusCode, body, tc.wantCode, tc.wantBody)
			}
			if ct := res.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			if gotCtx != req.Context() {
				t.Error("the check did not get the request's context")
			}
		})
	}
}
