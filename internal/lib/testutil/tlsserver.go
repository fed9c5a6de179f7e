package testutil

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// ServeTLS serves h over HTTPS with HTTP/2 on, as the door is served (gRPC
// needs HTTP/2), and closes the server when the test ends. The server's
// Client trusts its certificate and speaks HTTP/2.
func ServeTLS(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}
