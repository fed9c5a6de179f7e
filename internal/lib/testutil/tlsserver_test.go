package testutil

import (
	"io"
	"net/http"
	"testing"
)

// ServeTLS serves over HTTPS with HTTP/2, its client trusts it, and the
// server is closed when the test ends.
func TestServeTLSServesHTTP2OverTLSUntilTheTestEnds(t *testing.T) {
	var url string
	var client *http.Client
	t.Run("serving", func(t *testing.T) {
		srv := ServeTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Proto) }))
		url, client = srv.URL, srv.Client()
		res, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		if res.TLS == nil || string(body) != "HTTP/2.0" {
			t.Fatalf("TLS %v, protocol %q: want TLS and HTTP/2.0", res.TLS != nil, body)
		}
	})
	client.CloseIdleConnections()
	if res, err := client.Get(url); err == nil {
		res.Body.Close()
		t.Fatal("the server still answers after its test ended")
	}
}
