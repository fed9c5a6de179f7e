package verifier_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier"
)

// A cluster file registers a cluster; the verifier fetches its keys and turns
// a projected ServiceAccount token into a Runner subject.
func ExampleRunnerVerifier_Verify() {
	ctx := context.Background()
	is, _ := kubeissuer.New(kubeissuer.Options{}) // stands in for the cluster's API server
	defer is.Close()
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	caFile, _ := is.WriteCAFileIn(dir, "prod-eks")

	clusters, err := verifier.ParseRunnerClusters([]byte(fmt.Sprintf(`
clusters:
  - name: prod-eks
    issuer: %s
    caFile: %s
`, is.URL(), caFile)))
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := verifier.New(clusters, verifier.WithTenant("bootstrap"))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := v.Refresh(ctx); err != nil { // a Server calls Start(ctx) instead
		fmt.Println(err)
		return
	}

	token, _ := is.Token(kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal"}, 0)
	sub, err := v.Verify(ctx, token)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(sub.Kind, sub.ID, sub.Workload.NodeName)

	_, err = v.Verify(ctx, token[:len(token)-8]+"AAAAAAAA")
	fmt.Println(errors.Is(err, verifier.ErrUnauthenticated), err)
	// Output:
	// runner prod-eks/ip-10-0-1-5_ec2_internal ip-10-0-1-5.ec2.internal
	// true verifier: unauthenticated: cluster prod-eks: bad signature
}

// New needs only the clusters; the tenant stamped on subjects, the HTTP
// client the key sets are fetched with and the clock are options, each with
// a default (no tenant, http.DefaultTransport, time.Now).
func ExampleNew() {
	ctx := context.Background()
	is, _ := kubeissuer.New(kubeissuer.Options{}) // a private issuer: only is.Client() trusts its CA
	defer is.Close()
	clusters := []verifier.RunnerCluster{{Name: "prod-eks", Issuer: is.URL()}}

	v, err := verifier.New(clusters,
		verifier.WithTenant("bootstrap"),     // the Server's store's bootstrap tenant
		verifier.WithHTTPClient(is.Client()), // only its transport is used
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := v.Refresh(ctx); err != nil {
		fmt.Println(err)
		return
	}
	token, _ := is.Token(kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal"}, 0) // valid for 600 s
	sub, err := v.Verify(ctx, token)
	fmt.Println(sub.Tenant, sub.ID, err)

	inAnHour := func() time.Time { return time.Now().Add(time.Hour) }
	late, _ := verifier.New(clusters, verifier.WithHTTPClient(is.Client()), verifier.WithClock(inAnHour))
	_ = late.Refresh(ctx)
	_, err = late.Verify(ctx, token)
	fmt.Println(err)
	// Output:
	// bootstrap prod-eks/ip-10-0-1-5_ec2_internal <nil>
	// verifier: unauthenticated: cluster prod-eks: token expired
}

// Resolve dispatches by shape: a JWS goes to the verifier, anything else to
// the minted-token store.
func ExampleResolver_Resolve() {
	r := verifier.NewResolver(nil, nil) // no cluster, no store
	_, err := r.Resolve(context.Background(), "header.payload.signature", verifier.SubjectAccount)
	fmt.Println(errors.Is(err, verifier.ErrWrongKind), errors.Is(err, verifier.ErrUnauthenticated))
	_, err = r.Resolve(context.Background(), "header.payload.signature", verifier.SubjectRunner)
	fmt.Println(errors.Is(err, verifier.ErrTokenNotFound))
	// Output:
	// true true
	// true
}
