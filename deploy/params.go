// Package deploy renders the Kubernetes manifests that DL-440's guarantees
// depend on: the Runner's namespace, its binding-free ServiceAccount, its
// DaemonSet with the projected token, the ValidatingAdmissionPolicy that limits
// who can wear the Runner's identity, the compass-callout Deployment, and a
// nats-server configuration for the callout in server-config mode with xkey.
//
// Render validates every parameter before it renders anything, and every
// value that reaches a manifest is either checked against a strict pattern or
// written as a quoted scalar. Secrets (the callout's signing and xkey seeds,
// NATS passwords) are referenced by name and never rendered.
package deploy

import (
	"slices"
	"time"
)

// Fixed names. The admission policy's expressions name the ServiceAccount and
// the DaemonSet literally (DL-440), so neither is a parameter.
const (
	// RunnerServiceAccount is the ServiceAccount whose projected token is the
	// Runner's identity; the policy's usesRunnerSA variable names it.
	RunnerServiceAccount = "compass-runner"
	// RunnerDaemonSet is the DaemonSet the policy's owner check names.
	RunnerDaemonSet = "compass-runner"
	// PolicyName names the ValidatingAdmissionPolicy and its binding.
	PolicyName = "compass-runner-identity"
	// ContainmentPolicyName names the second ValidatingAdmissionPolicy and its
	// binding (DL-456): what a Runner pod may not become after it is created.
	// DL-440's policy stays the record's own, word for word.
	ContainmentPolicyName = "compass-runner-containment"
	// TokenAudience is the projected token's audience, the cluster file's default.
	TokenAudience = "compass-runner"
	// TokenDir is where the projected token is mounted; TokenPath is the file.
	TokenDir  = "/var/run/secrets/compass/runner"
	TokenPath = TokenDir + "/token"
)

// Limits and defaults, each with its reason.
const (
	// MinTokenExpiration is the Kubernetes TokenRequest minimum (MinTokenAgeSec):
	// a shorter projected token is refused by the API server.
	MinTokenExpiration = 600 * time.Second
	// MinCalloutReplicas keeps the callout answering while one replica is
	// drained or rescheduled; NATS refuses every Runner while no callout answers.
	MinCalloutReplicas = 2
	// maxUsernameLen bounds a controllers/deployers entry: Kubernetes usernames
	// of service accounts are at most "system:serviceaccount:" + two 253-byte names.
	maxUsernameLen = 600
	// maxUsers bounds each of controllers and deployers; a longer list is a
	// mistake, not a configuration (the policy is meant to name a few identities).
	maxUsers = 16
	// maxImageLen bounds an image reference (registries cap names near 255,
	// plus a tag or a digest).
	maxImageLen = 512
	// DefaultNATSClusterReplicas is a cluster's size when NATSCluster is set
	// and NATSReplicas is not: one server can be drained while the other two
	// keep every Runner and the callout connected.
	DefaultNATSClusterReplicas = 3
	// MaxNATSReplicas bounds the cluster: the routes are a full mesh
	// (n(n-1)/2 connections, each a pool of three by default), and the
	// subjects the Runners and the callout use are few; a bigger installation
	// is a supercluster, a cluster per region joined by gateways
	// (NATSGateway).
	MaxNATSReplicas = 9
	// MinServerReplicas keeps the door answering while one Server is drained
	// or rescheduled (PostgreSQL only: the Servers share the database).
	MinServerReplicas = 2
	// MaxServerReplicas bounds the Deployment: every Server holds a NATS
	// connection and a database pool; more is a mistake, not a configuration.
	MaxServerReplicas = 20
	// maxCIDRs bounds each CIDR list: a NetworkPolicy names a few networks.
	maxCIDRs = 32
)

// Fixed names of the Server's objects and of what it references.
const (
	// ServerName names the Server's ServiceAccount, workload, PDB,
	// NetworkPolicy and door Service; ServerMetricsService its metrics Service.
	ServerName           = "compass-server"
	ServerMetricsService = "compass-server-metrics"
	// ServerNATSSecret holds password, the compass-server NATS user's password.
	ServerNATSSecret = "compass-server-nats"
	// ServerMigrateJob names the Job --migrate-job renders.
	ServerMigrateJob = "compass-server-migrate"
	// ServerBackupCronJob names the CronJob --backup-schedule renders.
	ServerBackupCronJob = "compass-server-backup"
	// RunnerClustersConfigMap holds clusters.yaml, the cluster file, for the
	// Server and the callout.
	RunnerClustersConfigMap = "compass-runner-clusters"
	// DefaultServerTLSSecret is the default door certificate Secret.
	DefaultServerTLSSecret = "compass-server-tls"
	// DefaultServerStorage is the default SQLite volume size: the store
	// holds token hashes and Runner rows, megabytes for thousands of Runners.
	DefaultServerStorage = "1Gi"
	// DefaultMetricsNamespace is where Prometheus usually runs.
	DefaultMetricsNamespace = "monitoring"
	// DefaultDatabasePort is PostgreSQL's port.
	DefaultDatabasePort = 5432
)

// DefaultIssuerCIDRs: every IPv4 address; the issuers are often public.
var DefaultIssuerCIDRs = []string{"0.0.0.0/0"}

// NATS monitoring (NATSMonitor): where nats-server's HTTP monitoring
// endpoint (/varz, /connz, /healthz) listens. It has no authentication and
// /connz lists every connection with its user (the Runner ID) and address,
// so by default it is reachable from inside the pod only.
const (
	// NATSMonitorLoopback binds it to 127.0.0.1:8222 (kubectl port-forward
	// reaches it; nothing on the pod network does). The default.
	NATSMonitorLoopback = "loopback"
	// NATSMonitorOff renders no monitoring endpoint.
	NATSMonitorOff = "off"
	// NATSMonitorPod listens on every address of the pod (0.0.0.0:8222), for
	// a Prometheus exporter or a scraper on the pod network; restrict it with
	// a NetworkPolicy.
	NATSMonitorPod = "pod"
)

// Fixed names of the Secrets the in-cluster nats-server reads, created out of
// band (docs/self-host.md).
const (
	// NATSUsersSecret holds callout-password, server-password and
	// kick-password, the passwords of the three users that bypass the
	// callout: compass-callout, compass-server and compass-kick, the
	// callout's kick identity (docs/self-host.md, "The kick identity").
	NATSUsersSecret = "compass-nats-users"
	// NATSRouteSecret holds password, the route user's password (cluster only).
	NATSRouteSecret = "compass-nats-route"
	// NATSRouteUser is the user every server authenticates its routes as.
	NATSRouteUser = "compass-route"
	// DefaultNATSTLSSecret and DefaultNATSRouteTLSSecret are the default
	// names of the client and route certificate Secrets.
	DefaultNATSTLSSecret      = "compass-nats-tls"
	DefaultNATSRouteTLSSecret = "compass-nats-route-tls"
)

// A region's gateway to the other regions of a NATS supercluster
// (NATSGateway; docs/helm.md, "A supercluster of regions"; DL-466).
const (
	// NATSGatewaySecret holds password, the gateway password: every region
	// has the same, which each server checks on the gateway connections it
	// accepts and sends on those it dials.
	NATSGatewaySecret = "compass-nats-gateway"
	// NATSGatewayUser is the user every gateway connection authenticates as.
	NATSGatewayUser = "compass-gateway"
	// DefaultNATSGatewayTLSSecret is the default name of the gateway
	// certificate Secret (tls.crt, tls.key, ca.crt).
	DefaultNATSGatewayTLSSecret = "compass-nats-gateway-tls"
	// DefaultNATSGatewayPort is nats-server's customary gateway port.
	DefaultNATSGatewayPort = 7222
	// MaxNATSGatewayRemotes bounds the other regions a region lists; each is
	// a gateway connection from every server of the region, and every
	// region lists every other.
	MaxNATSGatewayRemotes = 16
	// maxNATSGatewayURLs bounds one remote's URLs: a load balancer's address
	// or a few servers' names, not a fleet.
	maxNATSGatewayURLs = 16
)

// NATSGatewayRemote is another region of the supercluster, as this region's
// gateway dials it: its gateway name (its own NATSGatewayName) and the URLs
// its gateway is reached at, tls://host:port (nats:// is accepted: a
// gateway connection is TLS either way), without credentials.
type NATSGatewayRemote struct {
	Name string
	URLs []string
}

// Params are the render parameters. DefaultParams gives DL-440's defaults.
type Params struct {
	// Namespace holds the Runner's ServiceAccount and DaemonSet and is what the
	// policy's namespaceSelector matches. It must hold nothing else and no
	// RoleBinding (DL-440 §Global Constraints).
	Namespace string
	// CalloutNamespace holds compass-callout and, if rendered, nats-server. It
	// must differ from Namespace so the Runner's namespace stays binding-free
	// and holds only the Runner.
	CalloutNamespace string

	// ClusterName is this cluster's name in the Server's cluster file
	// ([a-z0-9-]{1,40}, the first segment of every Runner ID from it).
	ClusterName string
	// RunnerImage and CalloutImage are image references with a tag or digest.
	RunnerImage  string
	CalloutImage string
	// NATSImage, when set, renders an in-cluster nats-server Deployment and
	// Service that load the rendered configuration. Empty: bring your own NATS.
	NATSImage string

	// ServerURL is the Server's door (https://).
	ServerURL string
	// NATSURL is the NATS URL (or comma-separated URLs) the Runner and the
	// callout use: tls://, or nats:// to a loopback host only. A Runner sends
	// its token in CONNECT, and the token is valid at the door until its exp
	// plus the leeway, so it never crosses a network in clear text
	// (natsurl.CheckSealed).
	NATSURL string

	// MaxTokenLifetime is the cluster file's maxTokenLifetime for this cluster
	// (at least 600 s). TokenExpiration must not exceed it.
	MaxTokenLifetime time.Duration
	// TokenExpiration is the projected token's expirationSeconds, in
	// [MinTokenExpiration, MaxTokenLifetime], whole seconds.
	TokenExpiration time.Duration

	// Controllers are the usernames that may create Runner pods (the policy's
	// controllers variable). Deployers may create or change the DaemonSet.
	Controllers []string
	Deployers   []string

	// PriorityClassName, when set, is the Runner pods' priorityClassName (the
	// PriorityClass itself is not rendered).
	PriorityClassName string

	// CABundleConfigMap, when set, names a ConfigMap (key ca.crt, in both
	// namespaces) holding the PEM CA that signed the Server's and the NATS
	// server's certificates; it is mounted and passed as COMPASS_CA_FILE and
	// COMPASS_NATS_CA_FILE. Empty: the system roots.
	CABundleConfigMap string
	// CABundle, when set, is that CA's PEM itself: the chart renders it as
	// ConfigMap compass-ca (key ca.crt) in both namespaces, so nothing has
	// to exist before the install. Not with CABundleConfigMap.
	CABundle string
	// CABundleFile (--ca-bundle-file) is a PEM file RenderManifests reads
	// into CABundle.
	CABundleFile string

	// CalloutReplicas is the callout Deployment's replica count (≥ 2).
	CalloutReplicas int
	// NATSAccount is the account the callout issues Runner user JWTs for
	// (server-config mode: the user JWT's audience).
	NATSAccount string
	// NATSCalloutIssuer is the public account nkey (A...) that signs the
	// callout's responses; NATSCalloutXKey the callout's public curve key (X...).
	// Both public, so both may be parameters. Empty renders a placeholder that
	// nats-server refuses to load, so a forgotten key fails loudly.
	NATSCalloutIssuer string
	NATSCalloutXKey   string

	// NATSTLSSecret names the kubernetes.io/tls Secret (tls.crt, tls.key)
	// with the in-cluster nats-server's certificate for client connections;
	// its SANs must cover the host of every NATS URL. TLS is always on for
	// clients in the rendered configuration.
	NATSTLSSecret string
	// NATSMonitor is NATSMonitorLoopback (the default when empty),
	// NATSMonitorOff or NATSMonitorPod.
	NATSMonitor string

	// NATSCluster renders the in-cluster nats-server (NATSImage) as a
	// cluster of NATSReplicas servers: a StatefulSet behind a headless
	// Service, every server routed to every other over mutual TLS with a
	// route password, each with the same accounts and auth_callout block.
	NATSCluster bool
	// NATSReplicas is the number of nats-server replicas; 0 means the default:
	// DefaultNATSClusterReplicas with NATSCluster, else 1. 1 renders today's
	// single-server Deployment (even with NATSCluster); 2 to MaxNATSReplicas
	// a cluster.
	NATSReplicas int
	// NATSRouteTLSSecret names the Secret (tls.crt, tls.key, ca.crt) with the
	// certificate the servers present to each other on routes, both as server
	// and as client (extended key usages serverAuth and clientAuth), for
	// *.nats-headless.<callout namespace>.svc; ca.crt verifies the peer's.
	NATSRouteTLSSecret string

	// NATSGateway joins this region's NATS cluster (NATSImage with
	// NATSCluster) to the other regions' as a supercluster: every server
	// listens for gateway connections on NATSGatewayPort (0:
	// DefaultNATSGatewayPort) and dials every region of
	// NATSGatewayRemotes, over mutual TLS (NATSGatewayTLSSecret) with the
	// gateway password (Secret NATSGatewaySecret), accepting no region it
	// does not list. NATSGatewayName is this region's gateway name, which
	// the other regions list; it names the NATS cluster too, and each
	// server is <pod>.<name>. NATSGatewayAdvertise, when set, is the
	// host:port every server tells the other regions to dial instead of
	// its pod address (a load balancer's).
	NATSGateway          bool
	NATSGatewayName      string
	NATSGatewayPort      int
	NATSGatewayTLSSecret string
	NATSGatewayAdvertise string
	NATSGatewayRemotes   []NATSGatewayRemote

	// ServerImage, when set, renders the Server (compass-server serve) in
	// CalloutNamespace: a Deployment on PostgreSQL (ServerDatabaseSecret
	// set) or a single-replica StatefulSet with its SQLite database on a
	// PersistentVolumeClaim, Services for the door and the metrics, a
	// PodDisruptionBudget and an init container that runs compass-server
	// migrate. Empty: the Server runs elsewhere (ServerURL names its door).
	ServerImage string
	// ServerDatabaseSecret names a Secret (key url) holding the PostgreSQL
	// --database-url; it chooses the Deployment. Empty: SQLite.
	ServerDatabaseSecret string
	// CalloutDatabaseSecret, with ServerDatabaseSecret, names a Secret (key
	// url) with the URL compass-callout reads the Server's database through:
	// a role granted only SELECT (docs/store.md). Empty: the Server's own.
	CalloutDatabaseSecret string
	// ServerReplicas is the Server's replica count; 0 means the default:
	// MinServerReplicas on PostgreSQL, 1 on SQLite (the only value SQLite takes).
	ServerReplicas int
	// ServerTLSSecret names the kubernetes.io/tls Secret (tls.crt, tls.key)
	// with the door's certificate, mounted as a directory so a renewed
	// certificate reaches the Server (which reloads it).
	ServerTLSSecret string
	// ServerStorage is the SQLite volume's size request (Mi or Gi).
	ServerStorage string
	// BackupSchedule, when set, renders a CronJob (a cron schedule, "0 3 * *
	// *") that copies the Server's SQLite database into BackupClaim, an
	// existing PersistentVolumeClaim in CalloutNamespace, with compass-server
	// backup --to-dir, keeping the newest BackupKeep copies (0: DefaultBackupKeep).
	// PostgreSQL is backed up with pg_dump (docs/store.md): refused there.
	BackupSchedule string
	BackupClaim    string
	BackupKeep     int

	// NetworkPolicies renders a NetworkPolicy for the Server, the callout
	// and the in-cluster nats-server: the ingress and egress each needs,
	// every other connection denied.
	NetworkPolicies bool
	// DoorIngressCIDRs are the networks that may reach the door (8443);
	// empty: every address (the Runner namespace always may).
	DoorIngressCIDRs []string
	// MetricsNamespace is the namespace whose pods may scrape the metrics
	// ports (9090, and nats-server's 8222 with NATSMonitor pod).
	MetricsNamespace string
	// DatabaseCIDR and DatabasePort are where the Server and the callout
	// may reach PostgreSQL; empty CIDR: no database egress (SQLite, and a
	// callout without compass-callout-database).
	DatabaseCIDR string
	DatabasePort int
	// IssuerCIDRs are where the Server and the callout may reach the
	// clusters' issuers (discovery and JWKS, port 443); the issuers are
	// often public, so the default is every address.
	IssuerCIDRs []string
	// NATSCIDRs are where the callout, the Server and the Runners may reach
	// a NATS run outside this rendering (the NATS URLs' ports); empty: any
	// address. Unused with the in-cluster nats-server (NATSImage).
	NATSCIDRs []string
	// DoorEgressCIDRs are where the Runners may reach the door (the port of
	// ServerURL); empty: any address.
	DoorEgressCIDRs []string
	// GatewayCIDRs are the other regions' networks, with NATSGateway: where
	// gateway connections may come from (to NATSGatewayPort) and go to (the
	// remotes' ports); empty: any address.
	GatewayCIDRs []string
	// ServiceMonitor renders a monitoring.coreos.com/v1 ServiceMonitor for
	// each metrics Service and a PodMonitor for the Runners (the Prometheus
	// Operator's CRDs must be installed).
	ServiceMonitor bool
	// PrometheusRule renders the alerting rules (deploy/monitoring) as a
	// PrometheusRule; GrafanaDashboard the dashboard in a ConfigMap.
	PrometheusRule, GrafanaDashboard bool
	// MonitoringLabels ("key=value") are extra labels on the monitoring
	// objects: the release label kube-prometheus-stack's Prometheus selects
	// them by, for one.
	MonitoringLabels []string
}

// DefaultBackupKeep is how many scheduled backups the CronJob keeps: a week of
// daily copies. MaxBackupKeep is store.MaxBackupKeep, which backup --keep
// refuses beyond (TestBackupKeepLimitIsTheStores).
const (
	DefaultBackupKeep = 7
	MaxBackupKeep     = 1000
)

// Placeholders rendered for public keys that were not given.
const (
	PlaceholderIssuer = "REPLACE_WITH_CALLOUT_ISSUER_ACCOUNT_PUBLIC_KEY"
	PlaceholderXKey   = "REPLACE_WITH_CALLOUT_XKEY_PUBLIC_KEY"
)

// DL-440 §Global Constraints: the policy's render parameter defaults.
var (
	// DefaultControllers: per-controller credentials, then shared credentials.
	DefaultControllers = []string{
		"system:serviceaccount:kube-system:daemon-set-controller",
		"system:kube-controller-manager",
	}
	// DefaultDeployers: Flux's kustomize-controller.
	DefaultDeployers = []string{
		"system:serviceaccount:flux-system:kustomize-controller",
	}
)

// The images the manifests run by default: the ones .ci/images builds and
// tags with the first line of the repository's VERSION file (docs/images.md).
// TestImageVersionIsVERSION keeps ImageVersion equal to it.
const (
	ImageRepository = "ghcr.io/compass-runner"
	ImageVersion    = "v0.1.0"
)

// NATSImage is the nats-server image docs/self-host.md names for
// --nats-image: the nats-server version go.mod pins, which every test runs
// (the real binary built by .ci/tools.sh, and the embedded server), so what
// the guide installs is what was tested. An -alpine image: the pod's preStop
// hook and reloader run nats-server and sh from it. TestNATSImageIsTheTestedVersion
// keeps it, and every nats image the documentation names, on go.mod's version.
const NATSImage = "nats:2.15.2-alpine"

// DefaultParams returns the parameters of the checked-in rendering
// (deploy/kubernetes/compass-runner.yaml).
func DefaultParams() Params {
	return Params{
		Namespace:         "compass-runner",
		CalloutNamespace:  "compass-system",
		ClusterName:       "prod",
		RunnerImage:       ImageRepository + "/compass-runner:" + ImageVersion,
		CalloutImage:      ImageRepository + "/compass-callout:" + ImageVersion,
		ServerURL:         "https://compass.example.com:8443",
		NATSURL:           "tls://nats.compass-system.svc:4222",
		MaxTokenLifetime:  MinTokenExpiration,
		TokenExpiration:   MinTokenExpiration,
		Controllers:       slices.Clone(DefaultControllers),
		Deployers:         slices.Clone(DefaultDeployers),
		CalloutReplicas:   MinCalloutReplicas,
		NATSAccount:       "RUNNERS",
		NATSCalloutIssuer: "",
		NATSCalloutXKey:   "",

		NATSTLSSecret:      DefaultNATSTLSSecret,
		NATSMonitor:        NATSMonitorLoopback,
		NATSRouteTLSSecret: DefaultNATSRouteTLSSecret,

		NATSGatewayPort:      DefaultNATSGatewayPort,
		NATSGatewayTLSSecret: DefaultNATSGatewayTLSSecret,

		ServerTLSSecret:  DefaultServerTLSSecret,
		ServerStorage:    DefaultServerStorage,
		NetworkPolicies:  true,
		MetricsNamespace: DefaultMetricsNamespace,
		DatabasePort:     DefaultDatabasePort,
		IssuerCIDRs:      slices.Clone(DefaultIssuerCIDRs),
	}
}

// serverReplicas is how many Servers p renders (ServerReplicas with its
// default applied).
func (p Params) serverReplicas() int {
	switch {
	case p.ServerReplicas != 0:
		return p.ServerReplicas
	case p.ServerDatabaseSecret != "":
		return MinServerReplicas
	}
	return 1
}

// natsServers is how many nats-server replicas p renders (NATSReplicas with
// its default applied); more than one is a cluster.
func (p Params) natsServers() int {
	switch {
	case p.NATSReplicas != 0:
		return p.NATSReplicas
	case p.NATSCluster:
		return DefaultNATSClusterReplicas
	}
	return 1
}
