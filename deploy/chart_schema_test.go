package deploy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"sigs.k8s.io/yaml"

	"github.com/compass-runner/identity/deploy/chart"
)

// A Helm user renders the chart without Validate: values.schema.json and
// templates/_validate.tpl must refuse what Validate refuses, each naming the
// value. These tests render the chart directly (chart.Load, Render), as
// helm template does, never through Render, which runs Validate first.
//
// What Validate refuses and the chart cannot see, because Values() (or a
// values file) has no way to say it (TestTheChartCannotSeeWhatValuesLoses
// pins each one):
//
//   - A Compass image (runner, callout, Server) without a tag or a digest:
//     in the chart an empty tag means the chart's appVersion, the release
//     the chart belongs to, so "ghcr.io/compass-runner/compass-runner"
//     renders as ":v0.1.0". Only nats-server's image, which has no
//     appVersion, must carry its own tag or digest.
//   - A token expiration that is not whole seconds: the chart's value is
//     an integer of seconds (the schema refuses 600.5), and Values()
//     truncates the duration into it.
//   - A --monitoring-label without "=", or one key given twice: the chart's
//     labels are a map, which has no malformed pair and no second key.
//   - An issuer or xkey public key whose checksum is wrong: the schema
//     checks the prefix, the length and the base32 alphabet; the CRC-16
//     that nkeys checks is beyond a pattern and Sprig. nats-server refuses
//     such a key when it loads the configuration, so it fails loudly.
//
// The chart is also stricter than Validate in places, never looser: it
// checks the shape of values Validate ignores when unused (a CIDR with the
// NetworkPolicies off, a storage size without the Server), refuses any @ in
// the Server URL (Validate allows one in its path), non-ASCII host names in
// the Server and NATS URLs, and loopback spellings other than localhost,
// 127.x.y.z, [::1], [0:0:0:0:0:0:0:1] and [::ffff:127.x.y.z] for nats://.

// directRender renders the chart with p's values as helm template would,
// without Validate.
func directRender(t *testing.T, c *chart.Chart, p Params) (map[string]string, error) {
	t.Helper()
	return c.Render(p.Values(), chart.Release{Name: "compass", Namespace: "compass-system"})
}

// namesValue reports whether the chart's error names value ("server.replicas"):
// _validate.tpl's messages start with it, the schema's give its location
// (at /server/replicas).
func namesValue(msg, value string) bool {
	return strings.Contains(msg, value+":") || strings.Contains(msg, "at /"+strings.ReplaceAll(value, ".", "/"))
}

// badChecksum returns a public nkey of the kind create makes with its last
// character changed, so its CRC-16 no longer matches.
func badChecksum(t *testing.T, create func() (nkeys.KeyPair, error)) string {
	t.Helper()
	pub := publicKey(t, create)
	last := "A"
	if strings.HasSuffix(pub, "A") {
		last = "B"
	}
	return pub[:len(pub)-1] + last
}

func TestTheChartRefusesWhatValidateRefuses(t *testing.T) {
	c, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	// Each case starts from one of these, which both Validate and the chart
	// accept: a refusal below is the mutation's, not the base's.
	for name, p := range map[string]Params{"default": DefaultParams(), "sqlite": sqliteServerParams(), "postgres": postgresServerParams()} {
		if err := p.Validate(); err != nil {
			t.Fatalf("base %s: Validate: %v", name, err)
		}
		if _, err := directRender(t, c, p); err != nil {
			t.Fatalf("base %s: the chart: %v", name, err)
		}
	}
	withNATS := func(p *Params) { p.NATSImage = NATSImage }
	withSchedule := func(p *Params) {
		*p = sqliteServerParams()
		p.BackupSchedule, p.BackupClaim = "0 3 * * *", "compass-backups"
	}
	dnsLabel := strings.Repeat("a", 64)
	subdomain := strings.Repeat("a", 254)
	digest := "@sha256:" + strings.Repeat("0", 64)
	twoByteRunes := strings.Repeat("é", maxUsernameLen/2+1) // fewer than 600 characters, more than 600 bytes
	tests := []struct {
		name   string
		mutate func(*Params)
		value  string // the chart value the message must name
		secret string // text that must not appear in the message
	}{
		// Validate: namespaces and the cluster name.
		{"runner namespace empty", func(p *Params) { p.Namespace = "" }, "namespaces.runner", ""},
		{"runner namespace not DNS-1123", func(p *Params) { p.Namespace = "Compass_Runner" }, "namespaces.runner", ""},
		{"runner namespace injection", func(p *Params) { p.Namespace = "a\"\nkind: RoleBinding" }, "namespaces.runner", ""},
		{"runner namespace too long", func(p *Params) { p.Namespace = dnsLabel }, "namespaces.runner", ""},
		{"callout namespace not DNS-1123", func(p *Params) { p.CalloutNamespace = "compass.system" }, "namespaces.callout", ""},
		{"callout namespace is the runner namespace", func(p *Params) { p.CalloutNamespace = p.Namespace }, "namespaces.callout", ""},
		{"cluster name empty", func(p *Params) { p.ClusterName = "" }, "clusterName", ""},
		{"cluster name upper case", func(p *Params) { p.ClusterName = "Prod" }, "clusterName", ""},
		{"cluster name too long", func(p *Params) { p.ClusterName = strings.Repeat("a", 41) }, "clusterName", ""},
		{"cluster name with dot", func(p *Params) { p.ClusterName = "prod.eks" }, "clusterName", ""},

		// validImage.
		{"runner image empty", func(p *Params) { p.RunnerImage = "" }, "runner.image", ""},
		{"runner image with space", func(p *Params) { p.RunnerImage = "compass-runner:v1 --privileged" }, "runner.image", ""},
		{"runner image upper case registry", func(p *Params) { p.RunnerImage = "GHCR.IO/compass-runner/compass-runner:v1" }, "runner.image", ""},
		{"runner image short digest", func(p *Params) { p.RunnerImage = "ghcr.io/compass-runner/compass-runner@sha256:abc" }, "runner.image", ""},
		{"runner image double separator first", func(p *Params) { p.RunnerImage = "compass__runner:v1" }, "runner.image", ""},
		{"runner image longer than 512 bytes", func(p *Params) {
			p.RunnerImage = strings.Repeat("r", 250) + ".io/" + strings.Repeat("b", 250) + ":v1" + digest
		}, "runner.image", ""},
		{"callout image with quote", func(p *Params) { p.CalloutImage = "compass-callout:v1\"" }, "callout.image", ""},
		{"callout image tag too long", func(p *Params) { p.CalloutImage = "compass-callout:" + strings.Repeat("t", 129) }, "callout.image", ""},
		{"NATS image without tag", func(p *Params) { p.NATSImage = "nats" }, "nats.image", ""},
		{"NATS image with space", func(p *Params) { p.NATSImage = "nats:2.15 x" }, "nats.image", ""},
		{"server image with space", func(p *Params) { *p = sqliteServerParams(); p.ServerImage = "compass-server:v1 x" }, "server.image", ""},

		// validServerURL.
		{"server URL empty", func(p *Params) { p.ServerURL = "" }, "serverURL", ""},
		{"server URL http", func(p *Params) { p.ServerURL = "http://compass.example.com" }, "serverURL", ""},
		{"server URL with credentials", func(p *Params) { p.ServerURL = "https://u:hunter2@compass.example.com" }, "serverURL", "hunter2"},
		{"server URL with a lone user", func(p *Params) { p.ServerURL = "https://hunter2@compass.example.com" }, "serverURL", "hunter2"},
		{"server URL without host", func(p *Params) { p.ServerURL = "https:///x" }, "serverURL", ""},
		{"server URL with query", func(p *Params) { p.ServerURL = "https://compass.example.com/?a=b" }, "serverURL", ""},
		{"server URL with fragment", func(p *Params) { p.ServerURL = "https://compass.example.com/#a" }, "serverURL", ""},
		{"server URL with space", func(p *Params) { p.ServerURL = "https://compass.example.com/a b" }, "serverURL", ""},
		{"server URL with quote", func(p *Params) { p.ServerURL = "https://compass.example.com/a'" }, "serverURL", ""},
		{"server URL bad port", func(p *Params) { p.ServerURL = "https://compass.example.com:door" }, "serverURL", ""},
		{"server URL bad escape", func(p *Params) { p.ServerURL = "https://compass.example.com/%zz" }, "serverURL", ""},

		// validNATSURLs and natsurl.CheckSealed.
		{"NATS URL empty", func(p *Params) { p.NATSURL = "" }, "natsURL", ""},
		{"NATS URL http", func(p *Params) { p.NATSURL = "http://nats:4222" }, "natsURL", ""},
		{"NATS URL second entry WebSocket", func(p *Params) { p.NATSURL = "tls://a:4222,ws://b:4222" }, "natsURL", ""},
		{"NATS URL wss", func(p *Params) { p.NATSURL = "wss://nats.example.com:443" }, "natsURL", ""},
		{"NATS URL with credentials", func(p *Params) { p.NATSURL = "nats://user:hunter2@127.0.0.1:4222" }, "natsURL", "hunter2"},
		{"NATS URL with a token", func(p *Params) { p.NATSURL = "tls://a:4222,tls://hunter2@b:4222" }, "natsURL", "hunter2"},
		{"NATS URL plaintext", func(p *Params) { p.NATSURL = "nats://nats.compass-system.svc:4222" }, "natsURL", ""},
		{"NATS URL plaintext to a look-alike", func(p *Params) { p.NATSURL = "nats://localhost.example.com:4222" }, "natsURL", ""},
		{"NATS URL plaintext to 128.0.0.1", func(p *Params) { p.NATSURL = "nats://128.0.0.1:4222" }, "natsURL", ""},
		{"NATS URL without scheme", func(p *Params) { p.NATSURL = "127.0.0.1:4222" }, "natsURL", ""},
		{"NATS URL with path", func(p *Params) { p.NATSURL = "tls://nats:4222/x" }, "natsURL", ""},
		{"NATS URL with query", func(p *Params) { p.NATSURL = "tls://nats:4222?x=1" }, "natsURL", ""},
		{"NATS URL with fragment", func(p *Params) { p.NATSURL = "tls://nats:4222#x" }, "natsURL", ""},
		{"NATS URL blank entry", func(p *Params) { p.NATSURL = "tls://nats:4222," }, "natsURL", ""},
		{"NATS URL padded entry", func(p *Params) { p.NATSURL = "tls://a:4222, tls://b:4222" }, "natsURL", ""},
		{"NATS URL bad port", func(p *Params) { p.NATSURL = "tls://nats:bad" }, "natsURL", ""},

		// The token.
		{"max token lifetime below 600s", func(p *Params) { p.MaxTokenLifetime = 599 * time.Second }, "token.maxLifetimeSeconds", ""},
		{"expiration below 600s", func(p *Params) { p.TokenExpiration = 300 * time.Second }, "token.expirationSeconds", ""},
		{"expiration above max lifetime", func(p *Params) { p.TokenExpiration = 3600 * time.Second }, "token.expirationSeconds", ""},
		{"expiration just above max lifetime", func(p *Params) {
			p.MaxTokenLifetime, p.TokenExpiration = time.Hour, time.Hour+time.Second
		}, "token.expirationSeconds", ""},

		// validUsers, for both lists.
		{"controllers empty", func(p *Params) { p.Controllers = nil }, "policy.controllers", ""},
		{"controllers too many", func(p *Params) { p.Controllers = manyUsers(maxUsers + 1) }, "policy.controllers", ""},
		{"controllers empty entry", func(p *Params) { p.Controllers = []string{""} }, "policy.controllers", ""},
		{"controllers entry longer than 600 bytes", func(p *Params) { p.Controllers = []string{strings.Repeat("a", maxUsernameLen+1)} }, "policy.controllers", ""},
		{"controllers entry of 600 characters and more bytes", func(p *Params) { p.Controllers = []string{twoByteRunes} }, "policy.controllers", ""},
		{"controllers leading space", func(p *Params) { p.Controllers = []string{" a"} }, "policy.controllers", ""},
		{"controllers trailing space", func(p *Params) { p.Controllers = []string{"a "} }, "policy.controllers", ""},
		{"controllers single quote", func(p *Params) { p.Controllers = []string{"system:kube-controller-manager', 'x"} }, "policy.controllers", ""},
		{"controllers double quote", func(p *Params) { p.Controllers = []string{`a"b`} }, "policy.controllers", ""},
		{"controllers backslash", func(p *Params) { p.Controllers = []string{`a\`} }, "policy.controllers", ""},
		{"controllers backtick", func(p *Params) { p.Controllers = []string{"a`b"} }, "policy.controllers", ""},
		{"controllers newline", func(p *Params) { p.Controllers = []string{"a\nb"} }, "policy.controllers", ""},
		{"controllers zero-width space", func(p *Params) { p.Controllers = []string{"a\u200bb"} }, "policy.controllers", ""},
		{"controllers no-break space", func(p *Params) { p.Controllers = []string{"a\u00a0b"} }, "policy.controllers", ""},
		{"controllers listed twice", func(p *Params) { p.Controllers = []string{"a", "b", "a"} }, "policy.controllers", ""},
		{"deployers empty", func(p *Params) { p.Deployers = []string{} }, "policy.deployers", ""},
		{"deployers too many", func(p *Params) { p.Deployers = manyUsers(maxUsers + 1) }, "policy.deployers", ""},
		{"deployers with quote", func(p *Params) { p.Deployers = []string{"it's"} }, "policy.deployers", ""},
		{"deployers with tab", func(p *Params) { p.Deployers = []string{"a\tb"} }, "policy.deployers", ""},
		{"deployers entry longer than 600 bytes", func(p *Params) { p.Deployers = []string{twoByteRunes} }, "policy.deployers", ""},

		// Names of other objects.
		{"priority class not DNS", func(p *Params) { p.PriorityClassName = "High Priority" }, "runner.priorityClassName", ""},
		{"priority class too long", func(p *Params) { p.PriorityClassName = subdomain }, "runner.priorityClassName", ""},
		{"CA ConfigMap not DNS", func(p *Params) { p.CABundleConfigMap = "CA Bundle" }, "caBundleConfigMap", ""},
		{"CA ConfigMap too long", func(p *Params) { p.CABundleConfigMap = subdomain }, "caBundleConfigMap", ""},

		// The callout and NATS.
		{"callout replicas 1", func(p *Params) { p.CalloutReplicas = 1 }, "callout.replicas", ""},
		{"callout replicas negative", func(p *Params) { p.CalloutReplicas = -2 }, "callout.replicas", ""},
		{"NATS account with space", func(p *Params) { p.NATSAccount = "A B" }, "callout.account", ""},
		{"NATS account starting with a digit", func(p *Params) { p.NATSAccount = "1RUNNERS" }, "callout.account", ""},
		{"NATS account too long", func(p *Params) { p.NATSAccount = "R" + strings.Repeat("a", 64) }, "callout.account", ""},
		{"NATS account AUTH", func(p *Params) { p.NATSAccount = "AUTH" }, "callout.account", ""},
		{"NATS account SYS", func(p *Params) { p.NATSAccount = "SYS" }, "callout.account", ""},
		{"NATS issuer a user key", func(p *Params) { p.NATSCalloutIssuer = publicKey(t, nkeys.CreateUser) }, "callout.issuer", ""},
		{"NATS issuer a curve key", func(p *Params) { p.NATSCalloutIssuer = publicKey(t, nkeys.CreateCurveKeys) }, "callout.issuer", ""},
		{"NATS issuer cut short", func(p *Params) { p.NATSCalloutIssuer = publicKey(t, nkeys.CreateAccount)[:55] }, "callout.issuer", ""},
		{"NATS xkey an account key", func(p *Params) { p.NATSCalloutXKey = publicKey(t, nkeys.CreateAccount) }, "callout.xkey", ""},
		{"NATS xkey lower case", func(p *Params) { p.NATSCalloutXKey = strings.ToLower(publicKey(t, nkeys.CreateCurveKeys)) }, "callout.xkey", ""},
		{"NATS TLS secret empty", func(p *Params) { p.NATSTLSSecret = "" }, "nats.tlsSecret", ""},
		{"NATS TLS secret not DNS", func(p *Params) { p.NATSTLSSecret = "NATS TLS" }, "nats.tlsSecret", ""},
		{"NATS TLS secret too long", func(p *Params) { p.NATSTLSSecret = subdomain }, "nats.tlsSecret", ""},
		{"NATS monitor unknown", func(p *Params) { p.NATSMonitor = "public" }, "nats.monitor", ""},
		{"NATS replicas negative", func(p *Params) { p.NATSReplicas = -1 }, "nats.replicas", ""},
		{"NATS replicas above the limit", func(p *Params) { withNATS(p); p.NATSReplicas = MaxNATSReplicas + 1 }, "nats.replicas", ""},
		{"NATS replicas 2 without a NATS image", func(p *Params) { p.NATSReplicas = 2 }, "nats.replicas", ""},
		{"NATS cluster without a NATS image", func(p *Params) { p.NATSCluster = true }, "nats.cluster", ""},
		{"NATS route TLS secret not DNS", func(p *Params) { withNATS(p); p.NATSCluster = true; p.NATSRouteTLSSecret = "a_b" }, "nats.routeTLSSecret", ""},
		{"NATS route TLS secret empty in a cluster", func(p *Params) { withNATS(p); p.NATSReplicas = 2; p.NATSRouteTLSSecret = "" }, "nats.routeTLSSecret", ""},

		// validServer.
		{"server database secret without the Server", func(p *Params) { p.ServerDatabaseSecret = "db" }, "server.databaseSecret", ""},
		{"server replicas without the Server", func(p *Params) { p.ServerReplicas = 2 }, "server.replicas", ""},
		{"server database secret not DNS", func(p *Params) { *p = postgresServerParams(); p.ServerDatabaseSecret = "DB URL" }, "server.databaseSecret", ""},
		{"callout database secret without the Server", func(p *Params) { p.CalloutDatabaseSecret = "callout-db" }, "server.calloutDatabaseSecret", ""},
		{"callout database secret on SQLite", func(p *Params) { *p = sqliteServerParams(); p.CalloutDatabaseSecret = "callout-db" }, "server.calloutDatabaseSecret", ""},
		{"callout database secret not DNS", func(p *Params) { *p = postgresServerParams(); p.CalloutDatabaseSecret = "Callout DB" }, "server.calloutDatabaseSecret", ""},
		{"server replicas 2 on SQLite", func(p *Params) { *p = sqliteServerParams(); p.ServerReplicas = 2 }, "server.replicas", ""},
		{"server replicas negative on SQLite", func(p *Params) { *p = sqliteServerParams(); p.ServerReplicas = -1 }, "server.replicas", ""},
		{"server replicas 1 on PostgreSQL", func(p *Params) { *p = postgresServerParams(); p.ServerReplicas = 1 }, "server.replicas", ""},
		{"server replicas above the limit", func(p *Params) { *p = postgresServerParams(); p.ServerReplicas = MaxServerReplicas + 1 }, "server.replicas", ""},
		{"server TLS secret empty", func(p *Params) { *p = sqliteServerParams(); p.ServerTLSSecret = "" }, "server.tlsSecret", ""},
		{"server TLS secret not DNS", func(p *Params) { *p = sqliteServerParams(); p.ServerTLSSecret = "door cert" }, "server.tlsSecret", ""},
		{"server storage empty on SQLite", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "" }, "server.storage.size", ""},
		{"server storage without unit", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "1000" }, "server.storage.size", ""},
		{"server storage in Ti", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "1Ti" }, "server.storage.size", ""},
		{"server storage zero", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "0Gi" }, "server.storage.size", ""},
		{"server storage seven digits", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "1000000Mi" }, "server.storage.size", ""},
		{"server storage injection", func(p *Params) { *p = sqliteServerParams(); p.ServerStorage = "1Gi\n  x: y" }, "server.storage.size", ""},

		// validBackup.
		{"backup claim without a schedule", func(p *Params) { *p = sqliteServerParams(); p.BackupClaim = "compass-backups" }, "server.backup.schedule", ""},
		{"backup keep without a schedule", func(p *Params) { *p = sqliteServerParams(); p.BackupKeep = 3 }, "server.backup.schedule", ""},
		{"backup without the Server", func(p *Params) { withSchedule(p); p.ServerImage = "" }, "server.backup.schedule", ""},
		{"backup on PostgreSQL", func(p *Params) {
			withSchedule(p)
			p.ServerDatabaseSecret, p.DatabaseCIDR = "compass-server-database", "10.20.0.0/16"
		}, "server.backup.schedule", ""},
		{"backup schedule of words", func(p *Params) { withSchedule(p); p.BackupSchedule = "every day" }, "server.backup.schedule", ""},
		{"backup schedule of four fields", func(p *Params) { withSchedule(p); p.BackupSchedule = "0 3 * *" }, "server.backup.schedule", ""},
		{"backup schedule of six fields", func(p *Params) { withSchedule(p); p.BackupSchedule = "0 0 3 * * *" }, "server.backup.schedule", ""},
		{"backup schedule unknown macro", func(p *Params) { withSchedule(p); p.BackupSchedule = "@often" }, "server.backup.schedule", ""},
		{"backup schedule injection", func(p *Params) { withSchedule(p); p.BackupSchedule = "0 3 * * \"*\"" }, "server.backup.schedule", ""},
		{"backup claim empty", func(p *Params) { withSchedule(p); p.BackupClaim = "" }, "server.backup.claim", ""},
		{"backup claim not DNS", func(p *Params) { withSchedule(p); p.BackupClaim = "Backups!" }, "server.backup.claim", ""},
		{"backup keep negative", func(p *Params) { withSchedule(p); p.BackupKeep = -1 }, "server.backup.keep", ""},
		{"backup keep above the limit", func(p *Params) { withSchedule(p); p.BackupKeep = MaxBackupKeep + 1 }, "server.backup.keep", ""},

		// validMonitoringLabels.
		{"monitoring label prefix not DNS", func(p *Params) { p.MonitoringLabels = []string{"Example.com/team=a"} }, "monitoring.labels", ""},
		{"monitoring label prefix too long", func(p *Params) { p.MonitoringLabels = []string{subdomain + "/team=a"} }, "monitoring.labels", ""},
		{"monitoring label key empty", func(p *Params) { p.MonitoringLabels = []string{"=a"} }, "monitoring.labels", ""},
		{"monitoring label key ends in a dash", func(p *Params) { p.MonitoringLabels = []string{"team-=a"} }, "monitoring.labels", ""},
		{"monitoring label key too long", func(p *Params) { p.MonitoringLabels = []string{strings.Repeat("k", 64) + "=a"} }, "monitoring.labels", ""},
		{"monitoring label value with space", func(p *Params) { p.MonitoringLabels = []string{"release=a b"} }, "monitoring.labels", ""},
		{"monitoring label value too long", func(p *Params) { p.MonitoringLabels = []string{"release=" + strings.Repeat("v", 64)} }, "monitoring.labels", ""},
		{"monitoring label app.kubernetes.io/name", func(p *Params) { p.MonitoringLabels = []string{"app.kubernetes.io/name=x"} }, "monitoring.labels", ""},
		{"monitoring label app.kubernetes.io/part-of", func(p *Params) { p.MonitoringLabels = []string{"app.kubernetes.io/part-of=x"} }, "monitoring.labels", ""},
		{"monitoring label grafana_dashboard", func(p *Params) { p.MonitoringLabels = []string{"grafana_dashboard=0"} }, "monitoring.labels", ""},

		// validCIDRs and the NetworkPolicies.
		{"door CIDR not a CIDR", func(p *Params) { p.DoorIngressCIDRs = []string{"10.0.0.1"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"NATS CIDR not a CIDR", func(p *Params) { p.NATSCIDRs = []string{"nats.example"} }, "networkPolicies.natsCIDRs", ""},
		{"NATS CIDR with host bits", func(p *Params) { p.NATSCIDRs = []string{"10.0.0.1/8"} }, "networkPolicies.natsCIDRs", ""},
		{"NATS CIDR listed twice", func(p *Params) { p.NATSCIDRs = []string{"10.0.0.0/8", "10.0.0.0/8"} }, "networkPolicies.natsCIDRs", ""},
		{"door egress CIDR not a CIDR", func(p *Params) { p.DoorEgressCIDRs = []string{"10.0.0.1"} }, "networkPolicies.doorEgressCIDRs", ""},
		{"door egress CIDR with host bits", func(p *Params) { p.DoorEgressCIDRs = []string{"192.0.2.128/24"} }, "networkPolicies.doorEgressCIDRs", ""},
		{"door CIDR with host bits", func(p *Params) { p.DoorIngressCIDRs = []string{"10.0.0.1/8"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDR with host bits in the last octet", func(p *Params) { p.DoorIngressCIDRs = []string{"192.0.2.128/24"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDR IPv6 with host bits", func(p *Params) { p.DoorIngressCIDRs = []string{"2001:db8::1/64"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDR with leading zeros", func(p *Params) { p.DoorIngressCIDRs = []string{"010.0.0.0/8"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDR prefix too long", func(p *Params) { p.DoorIngressCIDRs = []string{"10.0.0.0/33"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDR with a zone", func(p *Params) { p.DoorIngressCIDRs = []string{"fe80::%eth0/64"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDR twice", func(p *Params) { p.DoorIngressCIDRs = []string{"10.0.0.0/8", "10.0.0.0/8"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDR twice in two spellings", func(p *Params) { p.DoorIngressCIDRs = []string{"2001:db8::/32", "2001:0db8:0::/32"} }, "networkPolicies.doorIngressCIDRs", ""},
		{"door CIDRs too many", func(p *Params) { p.DoorIngressCIDRs = manyCIDRs(maxCIDRs + 1) }, "networkPolicies.doorIngressCIDRs", ""},
		{"issuer CIDRs empty", func(p *Params) { p.IssuerCIDRs = nil }, "networkPolicies.issuerCIDRs", ""},
		{"issuer CIDR injection", func(p *Params) { p.IssuerCIDRs = []string{"0.0.0.0/0\"\n"} }, "networkPolicies.issuerCIDRs", ""},
		{"issuer CIDRs too many", func(p *Params) { p.IssuerCIDRs = manyCIDRs(maxCIDRs + 1) }, "networkPolicies.issuerCIDRs", ""},
		{"issuer CIDR with host bits", func(p *Params) { p.IssuerCIDRs = []string{"203.0.113.7/24"} }, "networkPolicies.issuerCIDRs", ""},
		{"metrics namespace not DNS", func(p *Params) { p.MetricsNamespace = "Monitoring" }, "networkPolicies.metricsNamespace", ""},
		{"metrics namespace empty", func(p *Params) { p.MetricsNamespace = "" }, "networkPolicies.metricsNamespace", ""},
		{"database CIDR not a CIDR", func(p *Params) { p.DatabaseCIDR = "db.example" }, "networkPolicies.databaseCIDR", ""},
		{"database CIDR with host bits", func(p *Params) { p.DatabaseCIDR = "10.20.0.1/16" }, "networkPolicies.databaseCIDR", ""},
		{"database CIDR missing on PostgreSQL", func(p *Params) { *p = postgresServerParams(); p.DatabaseCIDR = "" }, "networkPolicies.databaseCIDR", ""},
		{"database port zero", func(p *Params) { p.DatabaseCIDR = "10.0.0.0/8"; p.DatabasePort = 0 }, "networkPolicies.databasePort", ""},
		{"database port too big", func(p *Params) { p.DatabaseCIDR = "10.0.0.0/8"; p.DatabasePort = 65536 }, "networkPolicies.databasePort", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultParams()
			tt.mutate(&p)
			if err := p.Validate(); !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("Validate = %v, want ErrInvalidParams", err)
			}
			out, err := directRender(t, c, p)
			if !errors.Is(err, chart.ErrInvalidValues) {
				t.Fatalf("the chart rendered what Validate refuses (error %v)", err)
			}
			if out != nil {
				t.Fatal("the chart returned output with its error")
			}
			if !namesValue(err.Error(), tt.value) {
				t.Fatalf("the chart's error does not name %s: %v", tt.value, err)
			}
			if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Fatal("the chart's error repeats a credential")
			}
		})
	}
}

// Validate refuses these; the chart cannot see them, because the values
// have no way to say them (the comment at the top of this file says why).
// Each is pinned here so that a chart which starts refusing one moves it to
// TestTheChartRefusesWhatValidateRefuses.
func TestTheChartCannotSeeWhatValuesLoses(t *testing.T) {
	c, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*Params)
		shows  string // what the rendering shows instead
	}{
		{"runner image without tag", func(p *Params) { p.RunnerImage = ImageRepository + "/compass-runner" },
			`image: "` + ImageRepository + `/compass-runner:` + ImageVersion + `"`},
		{"server image without tag", func(p *Params) { *p = sqliteServerParams(); p.ServerImage = ImageRepository + "/compass-server" },
			`image: "` + ImageRepository + `/compass-server:` + ImageVersion + `"`},
		{"token expiration not whole seconds", func(p *Params) {
			p.MaxTokenLifetime, p.TokenExpiration = time.Hour, 700500*time.Millisecond
		}, "expirationSeconds: 700 "},
		{"monitoring label without =", func(p *Params) { p.ServiceMonitor = true; p.MonitoringLabels = []string{"release"} }, `"release": ""`},
		{"monitoring label twice", func(p *Params) { p.ServiceMonitor = true; p.MonitoringLabels = []string{"release=a", "release=b"} }, `"release": "b"`},
		{"issuer with a bad checksum", func(p *Params) { p.NATSCalloutIssuer = badChecksum(t, nkeys.CreateAccount) }, ""},
		{"xkey with a bad checksum", func(p *Params) { p.NATSCalloutXKey = badChecksum(t, nkeys.CreateCurveKeys) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := DefaultParams()
			tt.mutate(&p)
			if err := p.Validate(); !errors.Is(err, ErrInvalidParams) {
				t.Fatalf("Validate = %v, want ErrInvalidParams", err)
			}
			out, err := directRender(t, c, p)
			if err != nil {
				t.Fatalf("the chart now refuses it (%v): move the case to TestTheChartRefusesWhatValidateRefuses", err)
			}
			all := strings.Join(slices.Collect(maps.Values(out)), "\n")
			shows := tt.shows
			if shows == "" { // the keys: the rendering carries the key as given
				shows = cmp.Or(p.NATSCalloutIssuer, p.NATSCalloutXKey)
			}
			if !strings.Contains(all, shows) {
				t.Fatalf("the rendering does not show %q", shows)
			}
		})
	}
}

// values.yaml as it is fails the schema on exactly its two required values
// (so helm lint --strict fails until they are set); with them, and with the
// parameters manifests renders by default, it passes.
func TestTheSchemaAcceptsTheDefaults(t *testing.T) {
	c, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Values(map[string]any{})
	if want := "chart: invalid values: values.schema.json: at /clusterName: minLength: got 0, want 1; at /serverURL: minLength: got 0, want 1"; err == nil || err.Error() != want {
		t.Fatalf("values.yaml alone: %v, want %q", err, want)
	}
	if _, err := c.Values(map[string]any{"clusterName": "prod", "serverURL": "https://compass.example.com"}); err != nil {
		t.Fatalf("values.yaml with the two required values fails its own schema: %v", err)
	}
	_, err = c.Render(map[string]any{}, release)
	if !errors.Is(err, chart.ErrInvalidValues) || !namesValue(err.Error(), "clusterName") {
		t.Fatalf("values.yaml alone rendered with error %v, want clusterName required", err)
	}
	_, err = c.Render(map[string]any{"clusterName": "prod"}, release)
	if !errors.Is(err, chart.ErrInvalidValues) || !namesValue(err.Error(), "serverURL") {
		t.Fatalf("values.yaml with a cluster name rendered with error %v, want serverURL required", err)
	}
	out, err := c.Render(map[string]any{"clusterName": "prod", "serverURL": "https://compass.example.com"}, release)
	if err != nil {
		t.Fatalf("values.yaml with the two required values: %v", err)
	}
	if !strings.Contains(out["runner.yaml"], "kind: DaemonSet") {
		t.Fatal("values.yaml with the two required values rendered no Runner DaemonSet")
	}
	for name, p := range map[string]Params{
		"default":  DefaultParams(),
		"sqlite":   sqliteServerParams(),
		"postgres": postgresServerParams(),
		"cluster":  func() Params { p := DefaultParams(); p.NATSImage, p.NATSCluster = NATSImage, true; return p }(),
		"backup": func() Params {
			p := sqliteServerParams()
			p.BackupSchedule, p.BackupClaim, p.BackupKeep = "@daily", "compass-backups", MaxBackupKeep
			return p
		}(),
		"monitoring": func() Params {
			p := DefaultParams()
			p.ServiceMonitor, p.MonitoringLabels = true, []string{"release=kube-prometheus-stack", "example.com/team=platform", "empty="}
			return p
		}(),
		"loopback and IPv6": func() Params {
			p := DefaultParams()
			p.NATSURL = "nats://127.0.0.1:4222,nats://[::1]:4222,NATS://LOCALHOST:4222,TLS://nats.example.com:4222/"
			p.DoorIngressCIDRs = []string{"2001:db8::/32", "::/0", "fe80::/10", "10.128.0.0/9", "192.0.2.7/32"}
			return p
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			if err := p.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if _, err := c.Values(p.Values()); err != nil {
				t.Fatalf("the schema refuses what Validate accepts: %v", err)
			}
			if _, err := directRender(t, c, p); err != nil {
				t.Fatalf("the chart refuses what Validate accepts: %v", err)
			}
		})
	}
}

// Every key of values.yaml is described in values.schema.json, and every key
// the schema names for a value the chart defines is in values.yaml: the two
// are walked side by side. An object the chart defines refuses keys it does
// not name (additionalProperties: false); a Kubernetes type (a $defs entry
// named io.k8s.…) and a map of free keys (patternProperties) are not walked
// into, since their keys are Kubernetes'.
func TestTheSchemaDescribesEveryValue(t *testing.T) {
	raw, err := fs.ReadFile(chart.FS(), "values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	if raw, err = fs.ReadFile(chart.FS(), "values.schema.json"); err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	if got := schema["$schema"]; got != "https://json-schema.org/draft/2020-12/schema" {
		t.Fatalf("$schema = %v, want draft 2020-12", got)
	}
	defs, _ := schema["$defs"].(map[string]any)
	resolve := func(node map[string]any) (map[string]any, string) {
		ref, _ := node["$ref"].(string)
		if ref == "" {
			return node, ""
		}
		name := strings.TrimPrefix(ref, "#/$defs/")
		target, ok := defs[name].(map[string]any)
		if !ok {
			t.Fatalf("$ref %s names no $defs entry", ref)
		}
		return target, name
	}
	walked := 0
	var walk func(path string, vals map[string]any, node map[string]any)
	walk = func(path string, vals map[string]any, node map[string]any) {
		props, _ := node["properties"].(map[string]any)
		if node["additionalProperties"] != false {
			t.Errorf("%s: the schema does not refuse keys it does not name", cmp.Or(path, "the top level"))
		}
		for _, k := range slices.Sorted(maps.Keys(vals)) {
			walked++
			p := strings.TrimPrefix(path+"."+k, ".")
			prop, ok := props[k].(map[string]any)
			if !ok {
				t.Errorf("%s is in values.yaml, not in values.schema.json", p)
				continue
			}
			if d, _ := prop["description"].(string); len(d) < 10 {
				t.Errorf("%s: the schema's description %q says nothing", p, d)
			}
			target, def := resolve(prop)
			sub, isMap := vals[k].(map[string]any)
			_, free := target["patternProperties"]
			if isMap && !free && !strings.HasPrefix(def, "io.k8s.") {
				walk(p, sub, target)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(props)) {
			if _, ok := vals[k]; !ok {
				t.Errorf("values.schema.json describes %s, which values.yaml does not have", strings.TrimPrefix(path+"."+k, "."))
			}
		}
	}
	walk("", values, schema)
	if walked < 100 {
		t.Fatalf("walked %d keys of values.yaml, fewer than it has", walked)
	}

	// Anywhere in the schema, an object whose keys it names refuses others.
	var check func(where string, v any)
	check = func(where string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if _, named := v["properties"]; named && v["additionalProperties"] != false {
				t.Errorf("%s names its properties but does not refuse others", where)
			}
			for _, k := range slices.Sorted(maps.Keys(v)) {
				check(where+"/"+k, v[k])
			}
		case []any:
			for i, e := range v {
				check(fmt.Sprintf("%s/%d", where, i), e)
			}
		}
	}
	check("#", schema)
}
