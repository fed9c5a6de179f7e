package server_test

import (
	"testing"

	"connectrpc.com/connect"

	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/verifier"
)

// DL-440 "Tenancy": the verifier stamps the bootstrap tenant, and a minted
// Runner token carries the same. Serve builds the door's verifier with the
// store's bootstrap tenant: a Runner enrolling through the door with a
// projected token and one with a minted token are both subjects of that
// tenant, as the door's resolver (ServeInfo.Resolver, the one Serve gives
// the door) resolved them for Enroll, and both are recorded in it.
func TestServeStampsTheBootstrapTenant(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, caFile := servertest.TLS(t, dir)
	st := servertest.OpenStore(t, dir)
	tenant, err := st.BootstrapTenant(t.Context())
	if err != nil || tenant == "" {
		t.Fatalf("BootstrapTenant = %q, %v", tenant, err)
	}
	minted, _, err := st.Mint(t.Context(), verifier.SubjectRunner, "build-01")
	if err != nil {
		t.Fatal(err)
	}
	prod := testkeys.Issuer(t)
	prodCA, err := prod.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	projected, err := prod.Token(kubeissuer.Pod{NodeName: "node-a"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	si, done, cancel := servertest.Running(t, server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir,
		Clusters: []verifier.RunnerCluster{{Name: "prod", Issuer: prod.URL(), CAFile: prodCA}},
	})
	defer servertest.Stop(t, done, cancel)
	doorURL, hc := servertest.DoorClient(t, si, caFile)
	runners := runnerv1connect.NewRunnerServiceClient(hc, doorURL, connect.WithGRPC())
	for _, tc := range []struct {
		name, token, id, method string
	}{
		{"projected", projected, "prod/node-a", "projected"},
		{"minted", minted, "build-01", "minted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := connect.NewRequest(&runnerv1.EnrollRequest{Version: "v-test", Hostname: "host"})
			req.Header().Set("Authorization", "Bearer "+tc.token)
			res, err := runners.Enroll(t.Context(), req)
			if err != nil || res.Msg.GetRunnerId() != tc.id {
				t.Fatalf("Enroll = %v, %v; want Runner ID %s", res, err, tc.id)
			}
			sub, err := si.Resolver.Resolve(t.Context(), tc.token, verifier.SubjectRunner)
			if err != nil || sub.ID != tc.id || sub.Method() != tc.method {
				t.Fatalf("the door's resolver: %+v, %v; want %s by %s", sub, err, tc.id, tc.method)
			}
			if sub.Tenant != tenant {
				t.Fatalf("the door resolved %s in tenant %q, want the bootstrap tenant %q", tc.id, sub.Tenant, tenant)
			}
			r, err := st.GetRunner(t.Context(), tc.id)
			if err != nil || r.Tenant != tenant || r.Method != tc.method {
				t.Fatalf("recorded Runner = %+v, %v; want %s by %s in the bootstrap tenant %q", r, err, tc.id, tc.method, tenant)
			}
		})
	}
}
