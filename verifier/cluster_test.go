package verifier

import (
	"errors"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A cluster with only a name and an issuer gets the defaults, and so does
// one whose other keys are there with a null value.
func TestParseRunnerClusters_Defaults(t *testing.T) {
	want := RunnerCluster{Name: "prod-eks", Issuer: "https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE",
		Audience: "compass-runner", Namespace: "compass-runner", ServiceAccount: "compass-runner", MaxTokenLifetime: 600 * time.Second}
	for name, doc := range map[string]string{
		"absent": `
clusters:
  - name: prod-eks
    issuer: https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE
`,
		"null": `
clusters:
  - name: prod-eks
    issuer: https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE
    audience:
    namespace: ~
    serviceAccount: null
    jwksURI:
`,
	} {
		got, err := ParseRunnerClusters([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != 1 || got[0] != want {
			t.Fatalf("%s: got %+v, want %+v", name, got, want)
		}
	}
}

func TestParseRunnerClusters_Full(t *testing.T) {
	got, err := ParseRunnerClusters([]byte(`
clusters:
  - name: prod-eks                 # a comment
    issuer: https://oidc.example/id/A
    audience: compass-prod
    namespace: ops
    serviceAccount: runner
    maxTokenLifetime: 1h
    jwksURI: https://keys.example/jwks
    caFile: /etc/compass/ca.pem
  - name: lab
    issuer: https://lab.example
    maxTokenLifetime: 600s
    jwksFile: /etc/compass/lab-jwks.json
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].MaxTokenLifetime != time.Hour || got[0].ServiceAccount != "runner" ||
		got[0].JWKSURI != "https://keys.example/jwks" || got[0].CAFile != "/etc/compass/ca.pem" ||
		got[1].MaxTokenLifetime != 600*time.Second || got[1].JWKSFile != "/etc/compass/lab-jwks.json" {
		t.Fatalf("got %+v", got)
	}
}

// Every bad file fails with an error that names the cluster and the field.
func TestParseRunnerClusters_Errors(t *testing.T) {
	one := func(fields string) string {
		return "clusters:\n  - name: prod\n    issuer: https://a.example\n" + fields
	}
	cases := []struct {
		name, yaml string
		want       []string // substrings of the error, in any order
	}{
		{"duplicate names", "clusters:\n  - {name: prod, issuer: https://a.example}\n  - {name: prod, issuer: https://b.example}\n",
			[]string{`cluster "prod" (clusters[1])`, "name: duplicate of clusters[0]"}},
		{"issuers differing only by a trailing slash", "clusters:\n  - {name: a, issuer: https://a.example}\n  - {name: b, issuer: https://a.example/}\n",
			[]string{`cluster "b"`, "issuer:", `cluster "a"`}},
		{"maxTokenLifetime 599s", one("    maxTokenLifetime: 599s\n"), []string{`cluster "prod"`, "maxTokenLifetime:", "below the minimum 10m0s"}},
		{"maxTokenLifetime not a duration", one("    maxTokenLifetime: 600\n"), []string{`cluster "prod"`, "maxTokenLifetime:", "want a string"}},
		{"maxTokenLifetime garbage", one("    maxTokenLifetime: soon\n"), []string{`cluster "prod"`, "maxTokenLifetime:", "not a duration"}},
		{"unknown key", one("    jwksUrl: https://a.example/jwks\n"), []string{`cluster "prod"`, "jwksUrl: unknown key"}},
		{"unknown key before name", "clusters:\n  - issuer: https://a.example\n    audiance: x\n    name: prod\n", []string{`cluster "prod"`, "audiance: unknown key"}},
		{"duplicate key", one("    issuer: https://b.example\n"), []string{"clusters[0]", `duplicate key "issuer"`}},
		{"http issuer", "clusters:\n  - {name: prod, issuer: http://a.example}\n", []string{`cluster "prod"`, "issuer:", "https://"}},
		{"issuer without host", "clusters:\n  - {name: prod, issuer: 'https://'}\n", []string{`cluster "prod"`, "issuer:", "no host"}},
		// Found by FuzzParseRunnerClusters: url.Parse lowercases the scheme.
		{"issuer scheme not lowercase", "clusters:\n  - {name: prod, issuer: 'hTtps://0'}\n",
			[]string{`cluster "prod" (clusters[0]): issuer: "hTtps://0" must begin with lowercase "https://" (the token's iss is compared byte for byte)`}},
		{"issuer scheme upper case", "clusters:\n  - {name: prod, issuer: 'HTTPS://a.example'}\n", []string{`cluster "prod"`, `issuer: "HTTPS://a.example" must begin with lowercase "https://"`}},
		{"issuer with only a port", "clusters:\n  - {name: prod, issuer: 'https://:443'}\n", []string{`cluster "prod"`, "issuer:", "no host"}},
		{"issuer with an empty query", "clusters:\n  - {name: prod, issuer: 'https://a.example?'}\n", []string{`cluster "prod"`, "issuer:", "query"}},
		{"issuer with an empty fragment", "clusters:\n  - {name: prod, issuer: 'https://a.example#'}\n", []string{`cluster "prod"`, "issuer:", "fragment"}},
		{"issuer with empty user info", "clusters:\n  - {name: prod, issuer: 'https://@a.example'}\n", []string{`cluster "prod"`, "issuer:", "user info"}},
		{"jwksURI scheme not lowercase", one("    jwksURI: Https://a.example/k\n"), []string{`cluster "prod"`, `jwksURI: "Https://a.example/k" must begin with lowercase "https://"`}},
		{"issuer with query", "clusters:\n  - {name: prod, issuer: 'https://a.example?x=1'}\n", []string{`cluster "prod"`, "issuer:", "query"}},
		{"missing issuer", "clusters:\n  - {name: prod}\n", []string{`cluster "prod"`, "issuer: required"}},
		{"missing name", "clusters:\n  - {issuer: https://a.example}\n", []string{"clusters[0]", "name: required"}},
		{"bad name", "clusters:\n  - {name: Prod_EKS, issuer: https://a.example}\n", []string{`cluster "Prod_EKS"`, "name:", "[a-z0-9-]{1,40}"}},
		{"name too long", "clusters:\n  - {name: " + strings.Repeat("a", 41) + ", issuer: https://a.example}\n", []string{"name:", "[a-z0-9-]{1,40}"}},
		{"jwksURI and jwksFile", one("    jwksURI: https://a.example/k\n    jwksFile: /k.json\n"), []string{`cluster "prod"`, "jwksURI and jwksFile"}},
		{"http jwksURI", one("    jwksURI: http://a.example/k\n"), []string{`cluster "prod"`, "jwksURI:", "https://"}},
		{"bad namespace", one("    namespace: Compass_Runner\n"), []string{`cluster "prod"`, "namespace:"}},
		{"bad serviceAccount", one("    serviceAccount: a.b\n"), []string{`cluster "prod"`, "serviceAccount:"}},
		{"name not a string", "clusters:\n  - {name: [a], issuer: https://a.example}\n", []string{"name: want a string"}},
		{"cluster not a mapping", "clusters:\n  - prod\n", []string{"clusters[0]", "want a mapping"}},
		{"clusters not a list", "clusters: prod\n", []string{`"clusters" must be a list`}},
		{"unknown top-level key", "cluster:\n  - {name: prod, issuer: https://a.example}\n", []string{`unknown top-level key "cluster"`}},
		{"empty file", "", []string{"empty"}},
		{"no clusters", "clusters:\n", []string{`no "clusters" list`}},
		{"two documents", "clusters: []\n---\nclusters: []\n", []string{"more than one YAML document"}},
		{"not YAML", "clusters: [\n", []string{"cluster file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRunnerClusters([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("parsed: %+v", got)
			}
			if got != nil {
				t.Fatalf("returned clusters with an error: %+v", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseRunnerClusters_600sParses(t *testing.T) {
	got, err := ParseRunnerClusters([]byte("clusters:\n  - {name: prod, issuer: https://a.example, maxTokenLifetime: 600s}\n"))
	if err != nil || got[0].MaxTokenLifetime != MinTokenLifetime {
		t.Fatalf("got %+v, %v", got, err)
	}
	// An empty list is a valid file that trusts no cluster.
	got, err = ParseRunnerClusters([]byte("clusters: []\n"))
	if err != nil || len(got) != 0 {
		t.Fatalf("empty list: %+v, %v", got, err)
	}
}

// clusterFileOfSize is a valid one-cluster file of exactly n bytes: a
// comment pads it, and the issuer, last and with no newline after it, is
// cut if a reader drops the file's last byte.
func clusterFileOfSize(t *testing.T, n int) []byte {
	t.Helper()
	const body = "clusters:\n  - name: prod\n    issuer: https://a.example"
	b := []byte("#" + strings.Repeat("x", n-len(body)-2) + "\n" + body)
	if len(b) != n {
		t.Fatalf("built %d bytes, want %d", len(b), n)
	}
	return b
}

// The cluster file may hold 1 MiB: a file of exactly that size is read whole
// and parsed; one byte more is refused, by ParseRunnerClusters and by
// ReadClusterFile, which names the file.
func TestClusterFileSizeLimit(t *testing.T) {
	const limit = 1 << 20
	dir := t.TempDir()
	at, over := filepath.Join(dir, "at"), filepath.Join(dir, "over")
	if err := os.WriteFile(at, clusterFileOfSize(t, limit), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(over, clusterFileOfSize(t, limit+1), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadClusterFile(at)
	if err != nil || len(got) != 1 || got[0].Issuer != "https://a.example" {
		t.Fatalf("a file of %d bytes: %+v, %v", limit, got, err)
	}
	if _, err := ParseRunnerClusters(clusterFileOfSize(t, limit+1)); err == nil || err.Error() != "verifier: cluster file: larger than 1048576 bytes" {
		t.Fatalf("parse %d bytes: err = %v", limit+1, err)
	}
	if _, err := ReadClusterFile(over); err == nil || err.Error() != "verifier: cluster file: larger than 1048576 bytes (in "+over+")" {
		t.Fatalf("read %d bytes: err = %v", limit+1, err)
	}
}

func TestReadClusterFile_Errors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	if _, err := ReadClusterFile(missing); !errors.Is(err, fs.ErrNotExist) || err.Error() != "verifier: cluster file: open "+missing+": no such file or directory" {
		t.Fatalf("missing file: err = %v", err)
	}
	if _, err := ReadClusterFile(dir); err == nil || !strings.HasPrefix(err.Error(), "verifier: cluster file "+dir+": read ") {
		t.Fatalf("a directory: err = %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("clusters: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadClusterFile(bad); err == nil || err.Error() != `verifier: cluster file: line 1: "clusters" must be a list (in `+bad+")" {
		t.Fatalf("bad file: err = %v", err)
	}
}

// New re-checks clusters built in code, not only parsed ones.
func TestNewRejectsBadClusters(t *testing.T) {
	cases := map[string][]RunnerCluster{
		"599s":       {{Name: "a", Issuer: "https://a.example", MaxTokenLifetime: 599 * time.Second}},
		"http":       {{Name: "a", Issuer: "http://a.example"}},
		"hTtps":      {{Name: "a", Issuer: "hTtps://a.example"}},
		"jwks HTTPS": {{Name: "a", Issuer: "https://a.example", JWKSURI: "HTTPS://a.example/k"}},
		"no host":    {{Name: "a", Issuer: "https://:443"}},
		"dup name":   {{Name: "a", Issuer: "https://a.example"}, {Name: "a", Issuer: "https://b.example"}},
		"dup iss":    {{Name: "a", Issuer: "https://a.example/"}, {Name: "b", Issuer: "https://a.example"}},
		"both jwks":  {{Name: "a", Issuer: "https://a.example", JWKSURI: "https://a.example/k", JWKSFile: "/k"}},
	}
	for name, cs := range cases {
		if _, err := New(cs); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseRunnerClusters(f *testing.F) {
	f.Add([]byte("clusters:\n  - name: prod-eks\n    issuer: https://a.example\n    maxTokenLifetime: 600s\n"))
	f.Add([]byte("clusters:\n  - {name: a, issuer: https://a.example, jwksURI: https://k.example}\n  - {name: b, issuer: https://b.example/}\n"))
	f.Add([]byte("clusters: [{name: a, issuer: 'https://a.example', audience: x, namespace: y, serviceAccount: z, caFile: /c}]"))
	f.Add([]byte("clusters: &a [*a]"))
	// Found by this target: url.Parse lowercases the scheme, so the parser
	// took an issuer that is not spelled https://. Also in testdata/fuzz.
	f.Add([]byte("clusters:\n  - {name: a, issuer: hTtps://0}\n"))
	f.Add([]byte("clusters:\n  - {name: a, issuer: 'https://:443', jwksURI: 'https://k.example?'}\n"))
	f.Add([]byte("clusters:\n  - name: a\n    issuer: https://a.example\n    deny: {nodes: [ip-10-0-9-9.ec2.internal], nodeUIDs: [5d0c6a3e-1b7f-4b8e-9c2a-7f3e1d2c4b5a]}\n"))
	f.Add([]byte("clusters:\n  - {name: a, issuer: https://a.example, deny: {nodes: [], nodeUIDs: null}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cs, err := ParseRunnerClusters(data)
		if err != nil {
			if cs != nil {
				t.Fatal("clusters returned with an error")
			}
			return
		}
		names := map[string]bool{}
		issuers := map[string]bool{}
		for _, c := range cs {
			iss := strings.TrimRight(c.Issuer, "/")
			if !clusterNameRE.MatchString(c.Name) || names[c.Name] || issuers[iss] || c.MaxTokenLifetime < MinTokenLifetime ||
				!isHTTPSURL(c.Issuer) || (c.JWKSURI != "" && !isHTTPSURL(c.JWKSURI)) ||
				(c.JWKSURI != "" && c.JWKSFile != "") || c.Audience == "" ||
				!dns1123LabelRE.MatchString(c.Namespace) || !dns1123LabelRE.MatchString(c.ServiceAccount) {
				t.Fatalf("invalid cluster accepted: %+v", c)
			}
			if !validDenyOracle(c.Deny) {
				t.Fatalf("invalid deny list accepted: %+v", c.Deny)
			}
			names[c.Name] = true
			issuers[iss] = true
			// What the parser returns, New's re-check takes unchanged.
			again := c
			if err := again.normalize(); err != nil || !reflect.DeepEqual(again, c) {
				t.Fatalf("re-check of a parsed cluster: %v, %+v", err, again)
			}
		}
	})
}

// validDenyOracle is the fuzz oracle's reading of a deny list, written apart
// from NodeDeny.check: at most MaxDenyEntries a list; node names are
// lowercase DNS names of at most 253 bytes (labels of letters, digits and
// inner hyphens, joined by single dots); UIDs are at most 128 printable ASCII
// bytes with no space and no separator a log reader could trip on.
func validDenyOracle(d *NodeDeny) bool {
	if d == nil {
		return true
	}
	if len(d.Nodes) > MaxDenyEntries || len(d.NodeUIDs) > MaxDenyEntries {
		return false
	}
	for _, n := range d.Nodes {
		if n == "" || len(n) > 253 {
			return false
		}
		for _, label := range strings.Split(n, ".") {
			if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
				return false
			}
			for _, r := range label {
				if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
					return false
				}
			}
		}
	}
	for _, u := range d.NodeUIDs {
		if u == "" || len(u) > 128 || u[0] == '.' || u[0] == '-' || u[0] == '_' {
			return false
		}
		for _, r := range u {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
				return false
			}
		}
	}
	return true
}

// isHTTPSURL is the fuzz oracle's reading of DL-440's "issuer is https://",
// written apart from checkHTTPSURL: spelled with a lowercase https://, a URL
// with a host name, and nothing after the path.
func isHTTPSURL(s string) bool {
	if !strings.HasPrefix(s, "https://") || strings.ContainsAny(s, "?#") {
		return false
	}
	u, err := url.Parse(s)
	return err == nil && u.Hostname() != "" && u.User == nil && u.RawQuery == "" && u.Fragment == ""
}
