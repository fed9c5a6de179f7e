// Package healthz is the /readyz handler compass-server and compass-callout
// share, so a kubelet's readiness probe reads both daemons alike.
package healthz

import (
	"context"
	"fmt"
	"net/http"
)

// Ready answers a readiness probe: 200 "ready" when ready returns nil, or
// 503 with the error's text (one line per failing check) otherwise. The
// reasons are the daemon's own checks, never a token or a secret, so
// anyone who can reach the port may read them.
func Ready(ready func(context.Context) error) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := ready(req.Context()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err.Error())
			return
		}
		fmt.Fprintln(w, "ready")
	}
}
