package deploy

// The gateway's values (issue 35 item 3, DL-466): what manifests' flags and
// the chart's values accept, and the exact error each refusal gives on both
// sides.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/compass-runner/identity/deploy/chart"
)

// gatewayRemote is a remote gateway of name at urls.
func gatewayRemote(name string, urls ...string) NATSGatewayRemote {
	return NATSGatewayRemote{Name: name, URLs: urls}
}

// gatewayBase is region us-east of a supercluster: DefaultParams with the
// in-cluster NATS cluster and a gateway to eu-west, which both Validate
// and the chart accept.
func gatewayBase() Params {
	p := DefaultParams()
	p.NATSImage, p.NATSCluster = NATSImage, true
	p.NATSGateway, p.NATSGatewayName = true, "us-east"
	p.NATSGatewayRemotes = []NATSGatewayRemote{gatewayRemote("eu-west", "tls://nats-gateway.eu-west.example.com:7222")}
	return p
}

// manyRemotes are n remotes, r0 to r<n-1>, each at one URL.
func manyRemotes(n int) []NATSGatewayRemote {
	out := make([]NATSGatewayRemote, n)
	for i := range out {
		out[i] = gatewayRemote(fmt.Sprintf("r%d", i), fmt.Sprintf("tls://r%d.example.com:7222", i))
	}
	return out
}

// Every refusal of a gateway value, as Validate says it (naming the flag
// where a flag is the fix) and as the chart says it (naming the value):
// each message is compared whole. The refusals the schema makes are its own
// messages; the rest are templates/_validate.tpl's, worded as Validate's.
func TestNATSGateway_RefusalsOnBothSides(t *testing.T) {
	c, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	base := gatewayBase()
	if err := base.Validate(); err != nil {
		t.Fatalf("the base: Validate: %v", err)
	}
	if _, err := directRender(t, c, base); err != nil {
		t.Fatalf("the base: the chart: %v", err)
	}
	many := make([]string, maxNATSGatewayURLs+1)
	for i := range many {
		many[i] = fmt.Sprintf("tls://n%d.eu-west.example.com:7222", i)
	}
	const (
		remotes = `NATS gateway remotes: entry 0 "eu-west": URL 1 `
		chartRe = `nats.gateway.remotes: entry 0 "eu-west": URL 1 `
	)
	tests := []struct {
		name    string
		mutate  func(*Params)
		manif   string // Validate's message, after "deploy: invalid parameters: "
		chart   string // the chart's, after "chart: invalid values: "
		secrets string // text neither may repeat
	}{
		// Off, but set.
		{"name without the gateway", func(p *Params) { p.NATSGateway = false },
			"NATS gateway: off, but its name, remotes or advertise address is set: give --nats-gateway to render it",
			"nats.gateway.enabled: false, but its name, remotes or advertise address is set: set nats.gateway.enabled to render it", ""},
		{"remotes without the gateway", func(p *Params) { p.NATSGateway, p.NATSGatewayName = false, "" },
			"NATS gateway: off, but its name, remotes or advertise address is set: give --nats-gateway to render it",
			"nats.gateway.enabled: false, but its name, remotes or advertise address is set: set nats.gateway.enabled to render it", ""},
		{"advertise without the gateway", func(p *Params) {
			p.NATSGateway, p.NATSGatewayName, p.NATSGatewayRemotes, p.NATSGatewayAdvertise = false, "", nil, "gw.example.com:7222"
		},
			"NATS gateway: off, but its name, remotes or advertise address is set: give --nats-gateway to render it",
			"nats.gateway.enabled: false, but its name, remotes or advertise address is set: set nats.gateway.enabled to render it", ""},

		// Only the in-cluster nats-server, as a cluster, joins a supercluster.
		{"without the in-cluster nats-server", func(p *Params) { p.NATSImage, p.NATSCluster = "", false },
			"NATS gateway: rendered only with the in-cluster nats-server (--nats-image) as a cluster (--nats-cluster); for your own NATS, configure its gateway yourself",
			"nats.gateway.enabled: rendered only with the in-cluster nats-server (nats.enabled) as a cluster (nats.cluster); for your own NATS, configure its gateway yourself", ""},
		{"a single server", func(p *Params) { p.NATSCluster = false },
			"NATS gateway: a single nats-server: a gateway joins this region's NATS cluster to the other regions', give --nats-cluster (or --nats-replicas 2 to 9)",
			"nats.gateway.enabled: a single nats-server: a gateway joins this region's NATS cluster to the other regions', set nats.cluster (or nats.replicas 2 to 9)", ""},
		{"a cluster of one", func(p *Params) { p.NATSReplicas = 1 },
			"NATS gateway: a single nats-server: a gateway joins this region's NATS cluster to the other regions', give --nats-cluster (or --nats-replicas 2 to 9)",
			"nats.gateway.enabled: a single nats-server: a gateway joins this region's NATS cluster to the other regions', set nats.cluster (or nats.replicas 2 to 9)", ""},

		// The name.
		{"no name", func(p *Params) { p.NATSGatewayName = "" },
			"NATS gateway name: required with --nats-gateway: this region's name in the supercluster, which every other region lists among its remotes",
			"nats.gateway.name: required with nats.gateway.enabled: this region's name in the supercluster, which every other region lists among its remotes", ""},
		{"name upper case", func(p *Params) { p.NATSGatewayName = "US-East" },
			`NATS gateway name: "US-East" is not a DNS-1123 label of at most 40 characters`,
			`nats.gateway.name: "US-East" is not a DNS-1123 label of at most 40 characters`, ""},
		{"name with a space", func(p *Params) { p.NATSGatewayName = "us east" },
			`NATS gateway name: "us east" is not a DNS-1123 label of at most 40 characters`,
			`nats.gateway.name: "us east" is not a DNS-1123 label of at most 40 characters`, ""},
		{"name ending in a dash", func(p *Params) { p.NATSGatewayName = "us-" },
			`NATS gateway name: "us-" is not a DNS-1123 label of at most 40 characters`,
			`nats.gateway.name: "us-" is not a DNS-1123 label of at most 40 characters`, ""},
		{"name of 41 characters", func(p *Params) { p.NATSGatewayName = strings.Repeat("a", 41) },
			`NATS gateway name: "` + strings.Repeat("a", 41) + `" is not a DNS-1123 label of at most 40 characters`,
			`nats.gateway.name: "` + strings.Repeat("a", 41) + `" is not a DNS-1123 label of at most 40 characters`, ""},
		{"name injection", func(p *Params) { p.NATSGatewayName = "us\"\n  listen: 0.0.0.0:1" },
			`NATS gateway name: "us\"\n  listen: 0.0.0.0:1" is not a DNS-1123 label of at most 40 characters`,
			`nats.gateway.name: "us\"\n  listen: 0.0.0.0:1" is not a DNS-1123 label of at most 40 characters`, ""},

		// The port.
		{"port negative", func(p *Params) { p.NATSGatewayPort = -1 },
			"NATS gateway port: -1 is not a TCP port",
			"values.schema.json: at /nats/gateway/port: minimum: got -1, want 1", ""},
		{"port above 65535", func(p *Params) { p.NATSGatewayPort = 70000 },
			"NATS gateway port: 70000 is not a TCP port",
			"values.schema.json: at /nats/gateway/port: maximum: got 70,000, want 65,535", ""},
		{"port of the clients", func(p *Params) { p.NATSGatewayPort = 4222 },
			"NATS gateway port: 4222 is nats-server's client port", "nats.gateway.port: 4222 is nats-server's client port", ""},
		{"port of the routes", func(p *Params) { p.NATSGatewayPort = 6222 },
			"NATS gateway port: 6222 is nats-server's route port", "nats.gateway.port: 6222 is nats-server's route port", ""},
		{"port of the monitoring", func(p *Params) { p.NATSGatewayPort = 8222 },
			"NATS gateway port: 8222 is nats-server's monitoring port", "nats.gateway.port: 8222 is nats-server's monitoring port", ""},

		// TLS is always on.
		{"TLS secret empty", func(p *Params) { p.NATSGatewayTLSSecret = "" },
			"NATS gateway TLS secret: empty: a gateway needs its certificate's Secret (tls.crt, tls.key, ca.crt); gateways are always TLS",
			"nats.gateway.tlsSecret: empty: a gateway needs its certificate's Secret (tls.crt, tls.key, ca.crt); gateways are always TLS", ""},
		{"TLS secret not DNS", func(p *Params) { p.NATSGatewayTLSSecret = "NATS TLS" },
			`NATS gateway TLS secret: "NATS TLS" is not a DNS-1123 subdomain`,
			`values.schema.json: at /nats/gateway/tlsSecret: 'NATS TLS' does not match pattern '^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$'`, ""},

		// The advertised address.
		{"advertise without port", func(p *Params) { p.NATSGatewayAdvertise = "gw.us-east.example.com" },
			`NATS gateway advertise: "gw.us-east.example.com" is not host:port, the address the other regions reach this region's gateway at`,
			`nats.gateway.advertise: "gw.us-east.example.com" is not host:port, the address the other regions reach this region's gateway at`, ""},
		{"advertise a URL", func(p *Params) { p.NATSGatewayAdvertise = "tls://gw.us-east.example.com:7222" },
			`NATS gateway advertise: "tls://gw.us-east.example.com:7222" is not host:port, the address the other regions reach this region's gateway at`,
			`nats.gateway.advertise: "tls://gw.us-east.example.com:7222" is not host:port, the address the other regions reach this region's gateway at`, ""},
		{"advertise port 0", func(p *Params) { p.NATSGatewayAdvertise = "203.0.113.7:0" },
			`NATS gateway advertise: "203.0.113.7:0" is not host:port, the address the other regions reach this region's gateway at`,
			`nats.gateway.advertise: "203.0.113.7:0" is not host:port, the address the other regions reach this region's gateway at`, ""},
		{"advertise port above 65535", func(p *Params) { p.NATSGatewayAdvertise = "[2001:db8::7]:65536" },
			`NATS gateway advertise: "[2001:db8::7]:65536" is not host:port, the address the other regions reach this region's gateway at`,
			`nats.gateway.advertise: "[2001:db8::7]:65536" is not host:port, the address the other regions reach this region's gateway at`, ""},

		// The remotes.
		{"no remotes", func(p *Params) { p.NATSGatewayRemotes = nil },
			"NATS gateway remotes: empty: list every other region's gateway (--nats-gateway-remote NAME=URL[,URL...]); this region accepts gateway connections from those it lists only",
			"nats.gateway.remotes: empty: list every other region's gateway (name and urls); this region accepts gateway connections from those it lists only", ""},
		{"too many remotes", func(p *Params) { p.NATSGatewayRemotes = manyRemotes(MaxNATSGatewayRemotes + 1) },
			"NATS gateway remotes: 17 entries, more than 16", "nats.gateway.remotes: 17 entries, more than 16", ""},
		{"remote without a name", func(p *Params) { p.NATSGatewayRemotes[0].Name = "" },
			"NATS gateway remotes: entry 0 has no name", "nats.gateway.remotes: entry 0 has no name", ""},
		{"remote name not a label", func(p *Params) { p.NATSGatewayRemotes[0].Name = "eu_west" },
			`NATS gateway remotes: entry 0: "eu_west" is not a gateway name (a DNS-1123 label of at most 40 characters)`,
			`nats.gateway.remotes: entry 0: "eu_west" is not a gateway name (a DNS-1123 label of at most 40 characters)`, ""},
		{"own name among the remotes", func(p *Params) {
			p.NATSGatewayRemotes = append(p.NATSGatewayRemotes, gatewayRemote("us-east", "tls://nats-gateway.us-east.example.com:7222"))
		},
			`NATS gateway remotes: entry 1 "us-east" is this region's own gateway name: list the other regions only`,
			`nats.gateway.remotes: entry 1 "us-east" is this region's own gateway name: list the other regions only`, ""},
		{"remote listed twice", func(p *Params) {
			p.NATSGatewayRemotes = append(p.NATSGatewayRemotes, gatewayRemote("ap-south", "tls://ap.example.com:7222"), gatewayRemote("eu-west", "tls://eu2.example.com:7222"))
		},
			`NATS gateway remotes: entry 2 "eu-west" is listed twice`, `nats.gateway.remotes: entry 2 "eu-west" is listed twice`, ""},
		{"remote without a URL", func(p *Params) { p.NATSGatewayRemotes[0].URLs = nil },
			`NATS gateway remotes: entry 0 "eu-west" has no URL`, `nats.gateway.remotes: entry 0 "eu-west" has no URL`, ""},
		{"remote with too many URLs", func(p *Params) { p.NATSGatewayRemotes[0].URLs = many },
			`NATS gateway remotes: entry 0 "eu-west" has 17 URLs, more than 16`, `nats.gateway.remotes: entry 0 "eu-west" has 17 URLs, more than 16`, ""},

		// The remotes' URLs.
		{"URL with credentials", func(p *Params) {
			p.NATSGatewayRemotes[0].URLs = []string{"tls://compass-gateway:hunter2@eu.example.com:7222"}
		},
			remotes + "carries credentials: the gateway password comes from Secret compass-nats-gateway",
			chartRe + "carries credentials: the gateway password comes from Secret compass-nats-gateway", "hunter2"},
		{"URL with a lone user", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"tls://hunter2@eu.example.com:7222"} },
			remotes + "carries credentials: the gateway password comes from Secret compass-nats-gateway",
			chartRe + "carries credentials: the gateway password comes from Secret compass-nats-gateway", "hunter2"},
		{"URL http", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"http://eu.example.com:7222"} },
			remotes + `"http://eu.example.com:7222" is not tls:// (or nats://: a gateway connection is TLS either way)`,
			chartRe + `"http://eu.example.com:7222" is not tls:// (or nats://: a gateway connection is TLS either way)`, ""},
		{"URL WebSocket", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"wss://eu.example.com:443"} },
			remotes + `"wss://eu.example.com:443" is not tls:// (or nats://: a gateway connection is TLS either way)`,
			chartRe + `"wss://eu.example.com:443" is not tls:// (or nats://: a gateway connection is TLS either way)`, ""},
		{"URL without a scheme", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"eu.example.com:7222"} },
			remotes + `"eu.example.com:7222" is not tls:// (or nats://: a gateway connection is TLS either way)`,
			chartRe + `"eu.example.com:7222" is not tls:// (or nats://: a gateway connection is TLS either way)`, ""},
		{"URL without a port", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"tls://eu.example.com"} },
			remotes + `"tls://eu.example.com" must be tls://host:port, without path, query, space or quote`,
			chartRe + `"tls://eu.example.com" must be tls://host:port, without path, query, space or quote`, ""},
		{"URL with a path", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"tls://eu.example.com:7222/x"} },
			remotes + `"tls://eu.example.com:7222/x" must be tls://host:port, without path, query, space or quote`,
			chartRe + `"tls://eu.example.com:7222/x" must be tls://host:port, without path, query, space or quote`, ""},
		{"URL with a query", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"tls://eu.example.com:7222?x=1"} },
			remotes + `"tls://eu.example.com:7222?x=1" must be tls://host:port, without path, query, space or quote`,
			chartRe + `"tls://eu.example.com:7222?x=1" must be tls://host:port, without path, query, space or quote`, ""},
		{"URL with a quote", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{`tls://eu.example.com:7222"]`} },
			remotes + `"tls://eu.example.com:7222\"]" must be tls://host:port, without path, query, space or quote`,
			chartRe + `"tls://eu.example.com:7222\"]" must be tls://host:port, without path, query, space or quote`, ""},
		{"URL with a newline", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"tls://eu.example.com:7222\n}"} },
			remotes + `"tls://eu.example.com:7222\n}" must be tls://host:port, without path, query, space or quote`,
			chartRe + `"tls://eu.example.com:7222\n}" must be tls://host:port, without path, query, space or quote`, ""},
		{"URL port 0", func(p *Params) { p.NATSGatewayRemotes[0].URLs = []string{"tls://eu.example.com:0"} },
			remotes + `"tls://eu.example.com:0" must be tls://host:port, without path, query, space or quote`,
			chartRe + `"tls://eu.example.com:0" must be tls://host:port, without path, query, space or quote`, ""},
		{"second URL bad", func(p *Params) {
			p.NATSGatewayRemotes[0].URLs = []string{"tls://a.example.com:7222", "tls://b.example.com:99999"}
		},
			`NATS gateway remotes: entry 0 "eu-west": URL 2 "tls://b.example.com:99999" must be tls://host:port, without path, query, space or quote`,
			`nats.gateway.remotes: entry 0 "eu-west": URL 2 "tls://b.example.com:99999" must be tls://host:port, without path, query, space or quote`, ""},

		// The NetworkPolicy's networks of the other regions.
		{"gateway CIDR with host bits", func(p *Params) { p.GatewayCIDRs = []string{"10.0.0.1/8"} },
			`gateway CIDRs: entry 0 "10.0.0.1/8" has host bits set (10.0.0.0/8)`,
			`networkPolicies.gatewayCIDRs: entry 0 "10.0.0.1/8" has host bits set past its prefix length (the API server refuses it)`, ""},
		{"gateway CIDR twice", func(p *Params) { p.GatewayCIDRs = []string{"203.0.113.0/24", "203.0.113.0/24"} },
			`gateway CIDRs: entry 1 "203.0.113.0/24" is listed twice`,
			`values.schema.json: at /networkPolicies/gatewayCIDRs: items at 0 and 1 are equal`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := gatewayBase()
			p.NATSGatewayRemotes = slices.Clone(p.NATSGatewayRemotes)
			tt.mutate(&p)
			err := p.Validate()
			if want := "deploy: invalid parameters: " + tt.manif; err == nil || err.Error() != want || !errors.Is(err, ErrInvalidParams) {
				t.Errorf("Validate:\n got %v\nwant %s", err, want)
			}
			out, err := directRender(t, c, p)
			if want := "chart: invalid values: " + tt.chart; err == nil || err.Error() != want || !errors.Is(err, chart.ErrInvalidValues) || out != nil {
				t.Errorf("the chart:\n got %v\nwant %s", err, want)
			}
			if tt.secrets != "" && (strings.Contains(tt.manif, tt.secrets) || strings.Contains(tt.chart, tt.secrets)) {
				t.Error("a message repeats a credential")
			}
		})
	}
}

// What both accept: every form of URL and address the rules allow, and the
// gateway off with its certificate and port left at their defaults.
func TestNATSGateway_AcceptedOnBothSides(t *testing.T) {
	c, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Params){
		"off, the defaults": func(p *Params) {
			*p = DefaultParams()
			p.NATSImage, p.NATSCluster = NATSImage, true
		},
		"URLs of every form": func(p *Params) {
			p.NATSGatewayRemotes = []NATSGatewayRemote{
				gatewayRemote("eu-west", "tls://nats-gateway.eu-west.example.com:7222", "TLS://203.0.113.9:443", "nats://[2001:db8::9]:7222"),
				gatewayRemote("ap-south-1", "nats://ap.example.com:65535"),
				gatewayRemote("0", "tls://localhost:1"),
			}
		},
		"advertise a name": func(p *Params) { p.NATSGatewayAdvertise = "nats-gateway.us-east.example.com:7222" },
		"advertise IPv6":   func(p *Params) { p.NATSGatewayAdvertise = "[2001:db8::7]:443" },
		"another port":     func(p *Params) { p.NATSGatewayPort = 443 },
		"five servers":     func(p *Params) { p.NATSReplicas = 5 },
		"16 remotes":       func(p *Params) { p.NATSGatewayRemotes = manyRemotes(MaxNATSGatewayRemotes) },
		"gateway CIDRs":    func(p *Params) { p.GatewayCIDRs = []string{"203.0.113.0/24", "2001:db8::/32"} },
		"without NetworkPolicies, CIDRs unchecked": func(p *Params) {
			p.NetworkPolicies, p.GatewayCIDRs = false, []string{"2001:db8::/32"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := gatewayBase()
			mutate(&p)
			if err := p.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if _, err := directRender(t, c, p); err != nil {
				t.Fatalf("the chart: %v", err)
			}
		})
	}
}
