package verifier

import (
	"strings"
	"testing"
)

// A cluster's tokenReview is parsed as strictly as the rest of the entry:
// the defaults filled, each bad value refused naming the cluster, the key
// and why.
func TestParseRunnerClusters_TokenReview(t *testing.T) {
	one := func(review string) string {
		return "clusters:\n  - name: prod\n    issuer: https://a.example\n    tokenReview:\n" + review
	}
	got, err := ParseRunnerClusters([]byte(one("      server: https://kubernetes.default.svc\n      tokenFile: /var/run/secrets/compass/kube/token\n")))
	if err != nil {
		t.Fatal(err)
	}
	want := TokenReview{Server: "https://kubernetes.default.svc", TokenFile: "/var/run/secrets/compass/kube/token", OnUnavailable: ReviewFallbackOffline}
	if got[0].TokenReview == nil || *got[0].TokenReview != want {
		t.Fatalf("tokenReview = %+v, want %+v", got[0].TokenReview, want)
	}
	got, err = ParseRunnerClusters([]byte(one("      server: https://10.0.0.1:6443\n      tokenFile: /t\n      caFile: /ca.crt\n      onUnavailable: refuse\n")))
	if err != nil {
		t.Fatal(err)
	}
	want = TokenReview{Server: "https://10.0.0.1:6443", TokenFile: "/t", CAFile: "/ca.crt", OnUnavailable: ReviewFailClosed}
	if *got[0].TokenReview != want {
		t.Fatalf("tokenReview = %+v, want %+v", got[0].TokenReview, want)
	}
	got, err = ParseRunnerClusters([]byte("clusters:\n  - name: prod\n    issuer: https://a.example\n    tokenReview: ~\n"))
	if err != nil || got[0].TokenReview != nil {
		t.Fatalf("tokenReview: ~ = %+v, %v; want none", got[0].TokenReview, err)
	}

	for _, tc := range []struct {
		name, review, want string
	}{
		{"no server", "      tokenFile: /t\n", `verifier: cluster "prod" (clusters[0]): tokenReview: server: required`},
		{"an http server", "      server: http://kubernetes.default.svc\n      tokenFile: /t\n", `verifier: cluster "prod" (clusters[0]): tokenReview: server: "http://kubernetes.default.svc" must begin with lowercase "https://"`},
		{"a server with user info", "      server: https://u:p@k.example\n      tokenFile: /t\n", `tokenReview: server: "https://u:p@k.example" may not carry user info`},
		{"no tokenFile", "      server: https://k.example\n", `verifier: cluster "prod" (clusters[0]): tokenReview: tokenFile: required`},
		{"another fallback", "      server: https://k.example\n      tokenFile: /t\n      onUnavailable: allow\n", `tokenReview: onUnavailable: "allow" is neither offline nor refuse`},
		{"an unknown key", "      server: https://k.example\n      tokenFile: /t\n      token: abc\n", `verifier: cluster "prod" (clusters[0]): tokenReview: unknown key "token" (line 7); known keys are server, tokenFile, caFile, onUnavailable`},
		{"a duplicate key", "      server: https://k.example\n      server: https://k.example\n      tokenFile: /t\n", `tokenReview: duplicate key "server" (line 6)`},
		{"a list", "      - server\n", `tokenReview: want a mapping with server, tokenFile, caFile and onUnavailable (line 5)`},
		{"a number", "      server: https://k.example\n      tokenFile: 12\n", `tokenReview: tokenFile: want a string (line 6)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRunnerClusters([]byte(one(tc.review)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
