package verifier

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// MinTokenLifetime is the floor (and default) of maxTokenLifetime: the Kubernetes
// TokenRequest minimum expirationSeconds. A shorter bound would reject every
// projected token.
const MinTokenLifetime = 600 * time.Second

// DefaultAudience is the projected token audience when a cluster names none.
const DefaultAudience = "compass-runner"

// DefaultNamespace and DefaultServiceAccount are where the rendered manifests put
// the Runner DaemonSet; a cluster entry may override either.
const (
	DefaultNamespace      = "compass-runner"
	DefaultServiceAccount = "compass-runner"
)

// MaxClusterFileBytes bounds the cluster file. It is operator-written
// infrastructure-as-code; a megabyte is thousands of clusters.
const MaxClusterFileBytes = 1 << 20

var clusterNameRE = regexp.MustCompile(`^[a-z0-9-]{1,40}$`)

// RFC 1123 label: what Kubernetes accepts for namespace and ServiceAccount names.
var dns1123LabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// RunnerCluster is one registered Kubernetes cluster: the trust root for the
// projected tokens of its Runner pods.
type RunnerCluster struct {
	Name             string        // [a-z0-9-]{1,40}; the first segment of the Runner ID
	Issuer           string        // begins with lowercase https://; compared byte for byte with the token's iss
	Audience         string        // default compass-runner
	Namespace        string        // default compass-runner
	ServiceAccount   string        // default compass-runner
	MaxTokenLifetime time.Duration // default and minimum 600s; upper bound on exp - iat
	JWKSURI          string        // optional; overrides OIDC discovery
	JWKSFile         string        // optional static JWKS; no fetch
	CAFile           string        // optional PEM CA for a private issuer; when set, the only CA trusted for its fetches

	// Deny lists nodes of this cluster that may not authenticate (nil: none).
	// A pointer keeps RunnerCluster comparable with ==.
	Deny *NodeDeny

	// TokenReview asks the cluster's API server about each token that
	// verified offline (nil: never). A pointer keeps RunnerCluster
	// comparable with ==.
	TokenReview *TokenReview
}

// clusterFields are the keys a cluster entry may have, in file order.
var clusterFields = []string{"name", "issuer", "audience", "namespace", "serviceAccount",
	"maxTokenLifetime", "jwksURI", "jwksFile", "caFile", "deny", "tokenReview"}

// ParseRunnerClusters parses and validates a cluster file. It is strict: an
// unknown key, a duplicate key, a bad value or a rule broken across clusters is
// an error that names the cluster (by name, or by index when it has none) and
// the field. Nothing is half-accepted: on error no cluster is returned.
func ParseRunnerClusters(data []byte) ([]RunnerCluster, error) {
	if len(data) > MaxClusterFileBytes {
		return nil, fmt.Errorf("verifier: cluster file: larger than %d bytes", MaxClusterFileBytes)
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("verifier: cluster file: empty; want a top-level \"clusters\" list")
		}
		return nil, fmt.Errorf("verifier: cluster file: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("verifier: cluster file: more than one YAML document")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("verifier: cluster file: line %d: want a mapping with a \"clusters\" list", root.Line)
	}
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "clusters" {
			return nil, fmt.Errorf("verifier: cluster file: line %d: unknown top-level key %q (want \"clusters\")", k.Line, k.Value)
		}
		if list != nil {
			return nil, fmt.Errorf("verifier: cluster file: line %d: duplicate key \"clusters\"", k.Line)
		}
		list = v
	}
	if list == nil || (list.Kind == yaml.ScalarNode && list.Tag == "!!null") {
		return nil, errors.New("verifier: cluster file: no \"clusters\" list")
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("verifier: cluster file: line %d: \"clusters\" must be a list", list.Line)
	}

	out := make([]RunnerCluster, 0, len(list.Content))
	for i, n := range list.Content {
		c, err := parseCluster(i, n)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if err := checkUnique(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkUnique enforces the rules across clusters: names unique, and issuers
// unique when compared without a trailing "/". The cluster is selected by
// iss, so two clusters sharing an issuer could forge each other's nodes.
func checkUnique(clusters []RunnerCluster) error {
	names := map[string]int{}
	issuers := map[string]string{}
	for i, c := range clusters {
		if j, dup := names[c.Name]; dup {
			return fmt.Errorf("verifier: cluster %q (clusters[%d]): name: duplicate of clusters[%d]", c.Name, i, j)
		}
		names[c.Name] = i
		key := strings.TrimRight(c.Issuer, "/")
		if other, dup := issuers[key]; dup {
			return fmt.Errorf("verifier: cluster %q: issuer: same issuer as cluster %q (compared without a trailing \"/\"); the cluster is selected by iss, so each issuer must be unique", c.Name, other)
		}
		issuers[key] = c.Name
	}
	return nil
}

func parseCluster(i int, n *yaml.Node) (RunnerCluster, error) {
	label := fmt.Sprintf("clusters[%d]", i)
	if n.Kind != yaml.MappingNode {
		return RunnerCluster{}, fmt.Errorf("verifier: cluster file: %s (line %d): want a mapping", label, n.Line)
	}
	// Name first, so every later error can name the cluster.
	vals := map[string]*yaml.Node{}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j], n.Content[j+1]
		if _, dup := vals[k.Value]; dup {
			return RunnerCluster{}, fmt.Errorf("verifier: cluster file: %s: line %d: duplicate key %q", label, k.Line, k.Value)
		}
		vals[k.Value] = v
	}
	if v := vals["name"]; v != nil && v.Kind == yaml.ScalarNode && v.Value != "" {
		label = fmt.Sprintf("%q (clusters[%d])", v.Value, i)
	}
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("verifier: cluster %s: %s: %s", label, field, fmt.Sprintf(format, args...))
	}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k := n.Content[j]
		if !known(k.Value) {
			return RunnerCluster{}, fail(k.Value, "unknown key (line %d); known keys are %s", k.Line, strings.Join(clusterFields, ", "))
		}
	}
	str := func(field string) (string, error) {
		v := vals[field]
		if v == nil || (v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
			return "", nil
		}
		if v.Kind != yaml.ScalarNode || v.Tag != "!!str" {
			return "", fail(field, "want a string (line %d)", v.Line)
		}
		return v.Value, nil
	}
	var c RunnerCluster
	var err error
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{"name", &c.Name}, {"issuer", &c.Issuer}, {"audience", &c.Audience},
		{"namespace", &c.Namespace}, {"serviceAccount", &c.ServiceAccount},
		{"jwksURI", &c.JWKSURI}, {"jwksFile", &c.JWKSFile}, {"caFile", &c.CAFile},
	} {
		if *f.dst, err = str(f.name); err != nil {
			return RunnerCluster{}, err
		}
	}
	lifetime, err := str("maxTokenLifetime")
	if err != nil {
		return RunnerCluster{}, err
	}
	if lifetime != "" {
		d, err := time.ParseDuration(lifetime)
		if err != nil {
			return RunnerCluster{}, fail("maxTokenLifetime", "%q is not a duration such as 600s or 1h", lifetime)
		}
		c.MaxTokenLifetime = d
	}
	if v := vals["deny"]; v != nil {
		if c.Deny, err = parseDeny(v); err != nil {
			return RunnerCluster{}, fail("deny", "%v", err)
		}
	}
	if v := vals["tokenReview"]; v != nil {
		if c.TokenReview, err = parseTokenReview(v); err != nil {
			return RunnerCluster{}, fail("tokenReview", "%v", err)
		}
	}
	if err := c.normalize(); err != nil {
		return RunnerCluster{}, fmt.Errorf("verifier: cluster %s: %w", label, err)
	}
	return c, nil
}

func known(key string) bool {
	for _, f := range clusterFields {
		if f == key {
			return true
		}
	}
	return false
}

// normalize fills defaults and checks one cluster on its own. The error names
// the field; the caller prefixes the cluster.
func (c *RunnerCluster) normalize() error {
	if c.Name == "" {
		return errors.New("name: required")
	}
	if !clusterNameRE.MatchString(c.Name) {
		return fmt.Errorf("name: %q must match [a-z0-9-]{1,40}", c.Name)
	}
	if c.Issuer == "" {
		return errors.New("issuer: required")
	}
	if err := checkHTTPSURL(c.Issuer, issuerNote); err != nil {
		return fmt.Errorf("issuer: %w", err)
	}
	if c.Audience == "" {
		c.Audience = DefaultAudience
	}
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if !dns1123LabelRE.MatchString(c.Namespace) {
		return fmt.Errorf("namespace: %q is not a Kubernetes namespace name", c.Namespace)
	}
	if c.ServiceAccount == "" {
		c.ServiceAccount = DefaultServiceAccount
	}
	if !dns1123LabelRE.MatchString(c.ServiceAccount) {
		return fmt.Errorf("serviceAccount: %q is not a Kubernetes ServiceAccount name", c.ServiceAccount)
	}
	if c.MaxTokenLifetime == 0 {
		c.MaxTokenLifetime = MinTokenLifetime
	}
	if c.MaxTokenLifetime < MinTokenLifetime {
		return fmt.Errorf("maxTokenLifetime: %s is below the minimum %s (the Kubernetes TokenRequest minimum; a shorter bound rejects every projected token)", c.MaxTokenLifetime, MinTokenLifetime)
	}
	if c.JWKSURI != "" && c.JWKSFile != "" {
		return errors.New("jwksURI and jwksFile: set at most one")
	}
	if c.JWKSURI != "" {
		if err := checkHTTPSURL(c.JWKSURI, ""); err != nil {
			return fmt.Errorf("jwksURI: %w", err)
		}
	}
	c.Deny = c.Deny.clone() // the verifier keeps its own copy
	if err := c.Deny.check(); err != nil {
		return fmt.Errorf("deny: %w", err)
	}
	c.TokenReview = c.TokenReview.clone()
	if err := c.TokenReview.check(); err != nil {
		return fmt.Errorf("tokenReview: %w", err)
	}
	return nil
}

// issuerNote says why the issuer's spelling matters.
const issuerNote = " (the token's iss is compared byte for byte)"

// checkHTTPSURL is the one check for a URL the verifier fetches from or
// compares: the issuer, a configured jwksURI and a discovered jwks_uri.
//
// It must begin with exactly lowercase "https://". url.Parse lowercases the
// scheme, so "hTtps://a.example" would otherwise pass as an https URL though
// it is not spelled as one; the issuer is compared byte for byte with the
// token's iss (and with discovery's issuer), so DL-440's "issuer is https://"
// is a rule about those bytes, and there is one spelling. The host must have
// a name ("https://:443" has only a port). No user info, and no "?" or "#" at
// all, even empty: "https://a.example?" would put the discovery path into the
// query.
// note is appended to the refusal of a bad prefix (why that field cares).
func checkHTTPSURL(raw, note string) error {
	if !strings.HasPrefix(raw, "https://") {
		return fmt.Errorf("%q must begin with lowercase \"https://\"%s", raw, note)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL", raw)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	if u.User != nil || strings.ContainsAny(raw, "?#") {
		return fmt.Errorf("%q may not carry user info, a query or a fragment", raw)
	}
	return nil
}
