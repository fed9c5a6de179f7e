package tokenreview_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/compass-runner/identity/tokenreview"
)

// A cluster's API server is asked about a Runner's token after the verifier
// accepted it offline: a live pod's token is accepted with the pod it is
// bound to, a deleted pod's is rejected, and an API server that cannot answer
// is unavailable (a door answers Unavailable, which Runners retry).
func Example() {
	api := exampleAPIServer() // stands in for the cluster's kube-apiserver
	defer api.close()

	r, err := tokenreview.New(tokenreview.Config{
		Server:         api.url,       // https://<the cluster's API server>
		TokenFile:      api.tokenFile, // e.g. a projected token of a ServiceAccount allowed to create tokenreviews
		CAFile:         api.caFile,
		Audience:       "compass-runner",
		Namespace:      "compass-runner",
		ServiceAccount: "compass-runner",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	notAfter := time.Now().Add(10 * time.Minute) // the verified token's exp plus leeway

	for _, token := range []string{"ok-live-pod", "dead-deleted-pod", "fail-etcd-timeout"} {
		res, err := r.Review(ctx, token, notAfter)
		switch {
		case err == nil:
			fmt.Println("accepted, bound to pod", res.PodName)
		case errors.Is(err, tokenreview.ErrRejected):
			fmt.Println("refuse:", err)
		case errors.Is(err, tokenreview.ErrUnavailable):
			fmt.Println("try again later:", err)
		}
	}
	// Output:
	// accepted, bound to pod compass-runner-x7k2p
	// refuse: tokenreview: token rejected: not authenticated: "[invalid bearer token, service account token has been invalidated]"
	// try again later: tokenreview: API server unavailable: status 503 Service Unavailable
}

type exampleAPI struct {
	url, caFile, tokenFile string
	close                  func()
}

// exampleAPIServer is newFakeAPI outside a test: an Example has no
// *testing.T.
func exampleAPIServer() exampleAPI {
	dir, err := os.MkdirTemp("", "tokenreview-example")
	if err != nil {
		panic(err)
	}
	f, err := startFakeAPI(dir)
	if err != nil {
		panic(err)
	}
	return exampleAPI{url: f.srv.URL, caFile: f.caFile, tokenFile: f.tokenFile, close: func() {
		f.srv.Close()
		_ = os.RemoveAll(dir)
	}}
}
