package deploy

import (
	"bytes"
	"cmp"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/internal/lib/natsurl"
)

// ErrInvalidParams is wrapped by every parameter error Render returns.
var ErrInvalidParams = errors.New("deploy: invalid parameters")

var (
	// clusterNameRE is DL-440's cluster name rule.
	clusterNameRE = regexp.MustCompile(`^[a-z0-9-]{1,40}$`)
	// dns1123LabelRE is a Kubernetes namespace or PriorityClass-safe label name.
	dns1123LabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	// dns1123SubdomainRE is a PriorityClass name (a DNS subdomain).
	dns1123SubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// imageRE is a conservative image reference: lower-case registry and path
	// components, then a tag and/or a digest (one of them required).
	imageRE = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)
	// natsAccountRE is a NATS account name usable unquoted in a config file
	// and as a user JWT audience.
	natsAccountRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)
	// storageRE is a volume size in Mi or Gi, at most 6 digits.
	storageRE = regexp.MustCompile(`^[1-9][0-9]{0,5}(Mi|Gi)$`)
	// gatewayNameRE is a NATS gateway name: a DNS-1123 label of at most 40
	// characters, quoted in the configuration and part of every server's
	// name (<pod>.<gateway>).
	gatewayNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$`)
	// hostPortRE is host:port, the host a DNS name, an IPv4 address or a
	// bracketed IPv6 address: a gateway URL's part after the scheme, and the
	// advertised gateway address. templates/_validate.tpl matches the same
	// expression (Sprig's regexMatch is Go's regexp).
	hostPortRE = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})$`)
)

// paramError names the parameter that is wrong.
func paramError(name, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidParams, name, fmt.Sprintf(format, args...))
}

// Validate checks every parameter and returns the first error, naming it.
func (p Params) Validate() error {
	if !dns1123LabelRE.MatchString(p.Namespace) {
		return paramError("namespace", "%q is not a DNS-1123 label", p.Namespace)
	}
	if !dns1123LabelRE.MatchString(p.CalloutNamespace) {
		return paramError("callout namespace", "%q is not a DNS-1123 label", p.CalloutNamespace)
	}
	if p.CalloutNamespace == p.Namespace {
		return paramError("callout namespace", "must differ from the Runner namespace %q, which holds only the Runner", p.Namespace)
	}
	if p.ClusterName == "" {
		return paramError("cluster name", "required: this cluster's name in the Server's cluster file (--cluster-name), [a-z0-9-]{1,40}")
	}
	if !clusterNameRE.MatchString(p.ClusterName) {
		return paramError("cluster name", "%q does not match [a-z0-9-]{1,40}", p.ClusterName)
	}
	if err := validImage("runner image", p.RunnerImage); err != nil {
		return err
	}
	if err := validImage("callout image", p.CalloutImage); err != nil {
		return err
	}
	if p.NATSImage != "" {
		if err := validImage("NATS image", p.NATSImage); err != nil {
			return err
		}
	}
	if err := validServerURL(p.ServerURL); err != nil {
		return err
	}
	if err := validNATSURLs(p.NATSURL); err != nil {
		return err
	}
	if p.MaxTokenLifetime < MinTokenExpiration {
		return paramError("max token lifetime", "%s is below the 600s minimum", p.MaxTokenLifetime)
	}
	if p.TokenExpiration%time.Second != 0 {
		return paramError("token expiration", "%s is not whole seconds", p.TokenExpiration)
	}
	if p.TokenExpiration < MinTokenExpiration || p.TokenExpiration > p.MaxTokenLifetime {
		return paramError("token expiration", "expirationSeconds %d is outside [600, %d] (the max token lifetime)",
			int64(p.TokenExpiration/time.Second), int64(p.MaxTokenLifetime/time.Second))
	}
	if err := validUsers("controllers", p.Controllers); err != nil {
		return err
	}
	if err := validUsers("deployers", p.Deployers); err != nil {
		return err
	}
	if p.PriorityClassName != "" && (len(p.PriorityClassName) > 253 || !dns1123SubdomainRE.MatchString(p.PriorityClassName)) {
		return paramError("priority class", "%q is not a DNS-1123 subdomain", p.PriorityClassName)
	}
	if p.CABundleConfigMap != "" && (len(p.CABundleConfigMap) > 253 || !dns1123SubdomainRE.MatchString(p.CABundleConfigMap)) {
		return paramError("CA bundle ConfigMap", "%q is not a DNS-1123 subdomain", p.CABundleConfigMap)
	}
	if p.CABundle != "" {
		if p.CABundleConfigMap != "" {
			return paramError("CA bundle", "given both as a file (--ca-bundle-file) and as a ConfigMap (--ca-configmap): give one")
		}
		if err := checkCABundle(p.CABundle); err != nil {
			return paramError("CA bundle", "%v", err)
		}
	}
	if p.CalloutReplicas < MinCalloutReplicas {
		return paramError("callout replicas", "%d is below %d", p.CalloutReplicas, MinCalloutReplicas)
	}
	if !natsAccountRE.MatchString(p.NATSAccount) {
		return paramError("NATS account", "%q is not a plain account name ([A-Za-z][A-Za-z0-9_-]{0,63})", p.NATSAccount)
	}
	if p.NATSAccount == "AUTH" || p.NATSAccount == "SYS" {
		return paramError("NATS account", "%q is reserved for the callout's or the system account", p.NATSAccount)
	}
	if p.NATSCalloutIssuer != "" && !nkeys.IsValidPublicAccountKey(p.NATSCalloutIssuer) {
		return paramError("NATS callout issuer", "not a public account nkey (A...)")
	}
	if p.NATSCalloutXKey != "" && !nkeys.IsValidPublicCurveKey(p.NATSCalloutXKey) {
		return paramError("NATS callout xkey", "not a public curve nkey (X...)")
	}
	if err := validSecretName("NATS TLS secret", p.NATSTLSSecret); err != nil {
		return err
	}
	switch p.NATSMonitor {
	case "", NATSMonitorLoopback, NATSMonitorOff, NATSMonitorPod:
	default:
		return paramError("NATS monitor", "%q is not %s, %s or %s", p.NATSMonitor, NATSMonitorLoopback, NATSMonitorOff, NATSMonitorPod)
	}
	if n := p.natsServers(); n < 1 || n > MaxNATSReplicas {
		return paramError("NATS replicas", "%d is outside [1, %d]", n, MaxNATSReplicas)
	} else if n > 1 {
		if p.NATSImage == "" {
			return paramError("NATS replicas", "a cluster of %d is rendered only with an in-cluster nats-server (a NATS image); for your own NATS, see the Helm values", n)
		}
		if err := validSecretName("NATS route TLS secret", p.NATSRouteTLSSecret); err != nil {
			return err
		}
	}
	if err := p.validGateway(); err != nil {
		return err
	}
	return p.validServer()
}

// validGateway checks the gateway's parameters: rendered only for the
// in-cluster nats-server as a cluster, with a name, its certificate, and the
// other regions, each once, none of them this one, at URLs that carry no
// credentials.
func (p Params) validGateway() error {
	if !p.NATSGateway {
		if p.NATSGatewayName != "" || len(p.NATSGatewayRemotes) > 0 || p.NATSGatewayAdvertise != "" {
			return paramError("NATS gateway", "off, but its name, remotes or advertise address is set: give --nats-gateway to render it")
		}
		return nil
	}
	if p.NATSImage == "" {
		return paramError("NATS gateway", "rendered only with the in-cluster nats-server (--nats-image) as a cluster (--nats-cluster); for your own NATS, configure its gateway yourself")
	}
	if p.natsServers() < 2 {
		return paramError("NATS gateway", "a single nats-server: a gateway joins this region's NATS cluster to the other regions', give --nats-cluster (or --nats-replicas 2 to %d)", MaxNATSReplicas)
	}
	name := p.NATSGatewayName
	if name == "" {
		return paramError("NATS gateway name", "required with --nats-gateway: this region's name in the supercluster, which every other region lists among its remotes")
	}
	if !gatewayNameRE.MatchString(name) {
		return paramError("NATS gateway name", "%q is not a DNS-1123 label of at most 40 characters", name)
	}
	port := cmp.Or(p.NATSGatewayPort, DefaultNATSGatewayPort)
	if port < 1 || port > 65535 {
		return paramError("NATS gateway port", "%d is not a TCP port", port)
	}
	for _, taken := range []struct {
		port int
		what string
	}{{4222, "client"}, {6222, "route"}, {8222, "monitoring"}} {
		if port == taken.port {
			return paramError("NATS gateway port", "%d is nats-server's %s port", port, taken.what)
		}
	}
	if p.NATSGatewayTLSSecret == "" {
		return paramError("NATS gateway TLS secret", "empty: a gateway needs its certificate's Secret (tls.crt, tls.key, ca.crt); gateways are always TLS")
	}
	if err := validSecretName("NATS gateway TLS secret", p.NATSGatewayTLSSecret); err != nil {
		return err
	}
	if a := p.NATSGatewayAdvertise; a != "" && !validHostPort(a) {
		return paramError("NATS gateway advertise", "%q is not host:port, the address the other regions reach this region's gateway at", a)
	}
	remotes := p.NATSGatewayRemotes
	if len(remotes) == 0 {
		return paramError("NATS gateway remotes", "empty: list every other region's gateway (--nats-gateway-remote NAME=URL[,URL...]); "+
			"this region accepts gateway connections from those it lists only")
	}
	if len(remotes) > MaxNATSGatewayRemotes {
		return paramError("NATS gateway remotes", "%d entries, more than %d", len(remotes), MaxNATSGatewayRemotes)
	}
	seen := make(map[string]bool, len(remotes))
	for i, r := range remotes {
		switch {
		case r.Name == "":
			return paramError("NATS gateway remotes", "entry %d has no name", i)
		case !gatewayNameRE.MatchString(r.Name):
			return paramError("NATS gateway remotes", "entry %d: %q is not a gateway name (a DNS-1123 label of at most 40 characters)", i, r.Name)
		case r.Name == name:
			return paramError("NATS gateway remotes", "entry %d %q is this region's own gateway name: list the other regions only", i, r.Name)
		case seen[r.Name]:
			return paramError("NATS gateway remotes", "entry %d %q is listed twice", i, r.Name)
		case len(r.URLs) == 0:
			return paramError("NATS gateway remotes", "entry %d %q has no URL", i, r.Name)
		case len(r.URLs) > maxNATSGatewayURLs:
			return paramError("NATS gateway remotes", "entry %d %q has %d URLs, more than %d", i, r.Name, len(r.URLs), maxNATSGatewayURLs)
		}
		seen[r.Name] = true
		for j, u := range r.URLs {
			if msg := gatewayURLProblem(u); msg != "" {
				return paramError("NATS gateway remotes", "entry %d %q: URL %d %s", i, r.Name, j+1, msg)
			}
		}
	}
	return nil
}

// gatewayURLProblem says what is wrong with a remote gateway's URL, or "".
// A URL with a user part is named by its place only: that part would be a
// credential.
func gatewayURLProblem(u string) string {
	if strings.Contains(u, "@") {
		return "carries credentials: the gateway password comes from Secret " + NATSGatewaySecret
	}
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok || (!strings.EqualFold(scheme, "tls") && !strings.EqualFold(scheme, "nats")) {
		return fmt.Sprintf("%q is not tls:// (or nats://: a gateway connection is TLS either way)", u)
	}
	if !validHostPort(rest) {
		return fmt.Sprintf("%q must be tls://host:port, without path, query, space or quote", u)
	}
	return ""
}

// validHostPort reports whether s is host:port (hostPortRE) with a port
// from 1 to 65535.
func validHostPort(s string) bool {
	m := hostPortRE.FindStringSubmatch(s)
	if m == nil {
		return false
	}
	port, err := strconv.Atoi(m[len(m)-1])
	return err == nil && port >= 1 && port <= 65535
}

// validServer checks the Server's and the NetworkPolicies' parameters.
func (p Params) validServer() error {
	if p.ServerImage != "" {
		if err := validImage("server image", p.ServerImage); err != nil {
			return err
		}
		if p.ServerDatabaseSecret != "" {
			if err := validSecretName("server database secret", p.ServerDatabaseSecret); err != nil {
				return err
			}
		}
		if p.CalloutDatabaseSecret != "" {
			if p.ServerDatabaseSecret == "" {
				return paramError("callout database secret", "set, but the Server is on SQLite: the callout reads its file in the Server's pod; a callout database secret is for PostgreSQL (a server database secret)")
			}
			if err := validSecretName("callout database secret", p.CalloutDatabaseSecret); err != nil {
				return err
			}
		}
		n := p.serverReplicas()
		switch {
		case p.ServerDatabaseSecret == "" && n != 1:
			return paramError("server replicas", "%d with SQLite: the database is one file on one volume that one Server writes; "+
				"for 2 or more, use PostgreSQL (a server database secret)", n)
		case p.ServerDatabaseSecret != "" && (n < MinServerReplicas || n > MaxServerReplicas):
			return paramError("server replicas", "%d is outside [%d, %d] on PostgreSQL", n, MinServerReplicas, MaxServerReplicas)
		}
		if err := validSecretName("server TLS secret", p.ServerTLSSecret); err != nil {
			return err
		}
		if p.ServerDatabaseSecret == "" && !storageRE.MatchString(p.ServerStorage) {
			return paramError("server storage", "%q is not a size in Mi or Gi (for example 1Gi)", p.ServerStorage)
		}
	} else if p.ServerDatabaseSecret != "" || p.ServerReplicas != 0 || p.CalloutDatabaseSecret != "" {
		return paramError("server image", "empty, but the Server's database secret, the callout's or the replicas are set; the Server is rendered only with an image")
	}
	if err := p.validBackup(); err != nil {
		return err
	}
	if _, err := validMonitoringLabels(p.MonitoringLabels); err != nil {
		return err
	}
	if !p.NetworkPolicies {
		return nil
	}
	if err := validCIDRs("door ingress CIDRs", p.DoorIngressCIDRs, true); err != nil {
		return err
	}
	if err := validCIDRs("issuer CIDRs", p.IssuerCIDRs, false); err != nil {
		return err
	}
	if err := validCIDRs("NATS CIDRs", p.NATSCIDRs, true); err != nil {
		return err
	}
	if err := validCIDRs("door egress CIDRs", p.DoorEgressCIDRs, true); err != nil {
		return err
	}
	if err := validCIDRs("gateway CIDRs", p.GatewayCIDRs, true); err != nil {
		return err
	}
	if !dns1123LabelRE.MatchString(p.MetricsNamespace) {
		return paramError("metrics namespace", "%q is not a DNS-1123 label", p.MetricsNamespace)
	}
	if p.DatabaseCIDR != "" {
		if err := validCIDRs("database CIDR", []string{p.DatabaseCIDR}, false); err != nil {
			return err
		}
		if p.DatabasePort < 1 || p.DatabasePort > 65535 {
			return paramError("database port", "%d is not a TCP port", p.DatabasePort)
		}
	} else if p.ServerImage != "" && p.ServerDatabaseSecret != "" {
		return paramError("database CIDR", "empty: the Server on PostgreSQL needs its network in the NetworkPolicy (or render without network policies)")
	}
	return nil
}

// validCIDRs checks a NetworkPolicy ipBlock list: canonical prefixes (the
// API server refuses 10.0.0.1/8), at most maxCIDRs, none twice.
func validCIDRs(name string, cidrs []string, emptyOK bool) error {
	if len(cidrs) == 0 && !emptyOK {
		return paramError(name, "empty: nothing would be reachable")
	}
	if len(cidrs) > maxCIDRs {
		return paramError(name, "%d entries, more than %d", len(cidrs), maxCIDRs)
	}
	seen := make(map[netip.Prefix]bool, len(cidrs))
	for i, c := range cidrs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			return paramError(name, "entry %d %q is not a CIDR", i, c)
		}
		if pfx.Masked() != pfx {
			return paramError(name, "entry %d %q has host bits set (%s)", i, c, pfx.Masked())
		}
		if seen[pfx] {
			return paramError(name, "entry %d %q is listed twice", i, c)
		}
		seen[pfx] = true
	}
	return nil
}

// cronFieldRE is one field of a five-field cron schedule (numbers, names,
// *, ranges, steps, lists); cronMacros are the CronJob controller's macros.
// The API server checks the values; this catches a schedule that is not one.
var (
	cronFieldRE = regexp.MustCompile(`^[0-9A-Za-z*?/,-]+$`)
	cronMacros  = []string{"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)

// validBackup checks the backup CronJob's parameters: only with the Server
// on SQLite, a schedule, a claim and a count within bounds.
func (p Params) validBackup() error {
	if p.BackupSchedule == "" {
		if p.BackupClaim != "" || p.BackupKeep != 0 {
			return paramError("backup schedule", "empty, but the backup claim or keep is set; the backup CronJob is rendered only with a schedule")
		}
		return nil
	}
	if p.ServerImage == "" || p.ServerDatabaseSecret != "" {
		return paramError("backup schedule", "the backup CronJob copies the Server's SQLite database (give --server-image, without --server-database-secret); "+
			"back PostgreSQL up with pg_dump on its own schedule (docs/store.md)")
	}
	fields := strings.Fields(p.BackupSchedule)
	switch {
	case len(fields) == 1 && slices.Contains(cronMacros, fields[0]):
	case len(fields) == 5 && !slices.ContainsFunc(fields, func(f string) bool { return !cronFieldRE.MatchString(f) }):
	default:
		return paramError("backup schedule", "%q is not a cron schedule: five fields (minute hour day-of-month month day-of-week, as \"0 3 * * *\") or one of %s", p.BackupSchedule, strings.Join(cronMacros, ", "))
	}
	if err := validSecretName("backup claim", p.BackupClaim); err != nil {
		return err
	}
	if k := p.BackupKeep; k != 0 && (k < 1 || k > MaxBackupKeep) {
		return paramError("backup keep", "%d is not from 1 to %d copies", k, MaxBackupKeep)
	}
	return nil
}

func validSecretName(name, s string) error {
	if s == "" {
		return paramError(name, "empty")
	}
	if len(s) > 253 || !dns1123SubdomainRE.MatchString(s) {
		return paramError(name, "%q is not a DNS-1123 subdomain", s)
	}
	return nil
}

func validImage(name, image string) error {
	if image == "" {
		return paramError(name, "empty")
	}
	if len(image) > maxImageLen || !imageRE.MatchString(image) {
		return paramError(name, "%q is not an image reference", image)
	}
	last := image[strings.LastIndex(image, "/")+1:]
	if !strings.Contains(last, ":") && !strings.Contains(image, "@") {
		return paramError(name, "%q has neither a tag nor a digest", image)
	}
	return nil
}

func validServerURL(raw string) error {
	if raw == "" {
		return paramError("server URL", "required: the Server's door the Runners enroll at (--server-url), https://")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return paramError("server URL", "%q is not a URL", raw)
	}
	if u.Scheme != "https" {
		return paramError("server URL", "%q is not https://", raw)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(raw, " \t\r\n\"'\\") {
		return paramError("server URL", "%q must be https://host[:port][/path] without credentials, query or fragment", raw)
	}
	return nil
}

// validNATSURLs checks the NATS URL list. A URL's user part is a credential
// to nats.go (user:password, or a lone token), so no message here repeats a
// URL with it: CheckSealed's errors drop it, and the shape errors below name
// the URL by its place in the list or without its user part.
func validNATSURLs(raw string) error {
	if raw == "" {
		return paramError("NATS URL", "empty")
	}
	if err := natsurl.CheckSealed(raw); err != nil {
		return fmt.Errorf("%w: NATS URL: %w", ErrInvalidParams, err)
	}
	for i, part := range strings.Split(raw, ",") {
		u, err := url.Parse(part)
		if err != nil {
			return paramError("NATS URL", "URL %d of the list is not a URL of the form tls://host:port", i+1)
		}
		if u.User != nil {
			return paramError("NATS URL", "URL %d of the list carries credentials (the Runner and the callout read theirs from files)", i+1)
		}
		switch u.Scheme {
		case "nats", "tls":
		case "ws", "wss":
			return paramError("NATS URL", "%s: a Runner's user JWT allows standard connections only, not WebSocket; use tls://", u.Redacted())
		default:
			return paramError("NATS URL", "URL %d of the list is not tls:// (or nats:// to loopback)", i+1)
		}
		if u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" ||
			strings.ContainsAny(part, " \t\r\n\"'\\") {
			return paramError("NATS URL", "URL %d of the list must be tls://host:port, without path, query, space or quote", i+1)
		}
	}
	return nil
}

// validUsers checks a controllers or deployers list. The names end up inside
// CEL single-quoted string literals, so anything that could end or escape a
// literal (quotes, backslashes) or break a line is refused rather than escaped.
func validUsers(name string, users []string) error {
	if len(users) == 0 {
		return paramError(name, "empty: the policy would admit nobody")
	}
	if len(users) > maxUsers {
		return paramError(name, "%d entries, more than %d", len(users), maxUsers)
	}
	seen := make(map[string]bool, len(users))
	for i, u := range users {
		if u == "" {
			return paramError(name, "entry %d is empty", i)
		}
		if len(u) > maxUsernameLen {
			return paramError(name, "entry %d is longer than %d bytes", i, maxUsernameLen)
		}
		if strings.TrimSpace(u) != u {
			return paramError(name, "entry %d %q has leading or trailing space", i, u)
		}
		for _, r := range u {
			if r == '\'' || r == '"' || r == '\\' || r == '`' || !unicode.IsPrint(r) {
				return paramError(name, "entry %d %q contains a quote, backslash or non-printable character", i, u)
			}
		}
		if seen[u] {
			return paramError(name, "entry %d %q is listed twice", i, u)
		}
		seen[u] = true
	}
	return nil
}

// checkCABundle refuses a CA bundle that is not one or more PEM
// certificates and nothing else: the pods would trust nothing, and every
// TLS handshake with the Server and NATS would fail.
func checkCABundle(pemText string) error {
	rest, n := []byte(pemText), 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("holds a PEM %s block: only certificates belong in it", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("certificate %d does not parse: %v", n+1, err)
		}
		n++
	}
	switch {
	case n == 0:
		return errors.New("holds no PEM certificate")
	case len(bytes.TrimSpace(rest)) > 0:
		return errors.New("has text after its last PEM certificate")
	}
	return nil
}
