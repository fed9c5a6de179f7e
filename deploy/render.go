package deploy

import (
	"bytes"
	"cmp"
	"embed"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
)

//go:embed templates/*.tmpl
var templateFS embed.FS

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"q":      quote,
	"indent": indent,
}).Option("missingkey=error").ParseFS(templateFS, "templates/*.tmpl"))

// view is what the templates see: validated parameters plus derived values.
type view struct {
	Params
	PolicyName, ServiceAccount, DaemonSet, Audience string
	TokenDir, TokenPath                             string
	TokenExpirationSeconds, MaxTokenLifetimeSeconds int64
	ControllersCEL, DeployersCEL                    string
	NATSConfig                                      string

	// NATSServers is how many nats-server replicas are rendered; NATSClustered
	// says more than one, as a StatefulSet with routes.
	NATSServers   int
	NATSClustered bool
	// NATSMonitorListen is the monitoring endpoint's host:port, empty for none.
	NATSMonitorListen string
	// NATSPeers are the servers' stable DNS names with the route port, in
	// order; NATSRouteURLs is the COMPASS_NATS_ROUTE_URLS value that names
	// them with the route user and $(COMPASS_NATS_ROUTE_PASSWORD).
	NATSPeers     []string
	NATSRouteURLs string
	// AuthTimeoutSeconds is authorization { timeout }: how long the server
	// waits for the callout's answer (not what a nats.go client waits: its
	// CONNECT ends at nats-server's first PING, about 2 s).
	AuthTimeoutSeconds int

	Names natsNames

	// ServerReplicas is how many Servers are rendered; ServerSQLite says the
	// StatefulSet with its volume rather than the PostgreSQL Deployment.
	ServerReplicas int
	ServerSQLite   bool
	// NATSURLPorts are the ports of the NATS URLs, sorted and distinct: the
	// egress a NetworkPolicy allows to a NATS run outside this rendering.
	NATSURLPorts []int
	Server       serverNames
	// CalloutInServerPod renders compass-callout as a container of the
	// Server's pod instead of its own Deployment: the Server runs here on
	// SQLite, and the callout must read the same file to resolve minted
	// tokens (DL-452). Callout is where its metrics listen.
	CalloutInServerPod bool
	Callout            calloutNames
	// NATS is the in-cluster nats-server pod's day-2 settings: lame duck
	// on termination and the reloader (DL-454).
	NATS natsPod
	// NATSHelmImage is NATSImage split for the Helm chart's values.
	NATSHelmImage struct{ Repository, Tag string }
	// BackupKeepCopies is BackupKeep with its default.
	BackupKeepCopies int
	// monitoringView: the ServiceMonitors', PrometheusRule's and dashboard's.
	monitoringView
}

// serverNames are the Server's fixed names, paths and ports.
type serverNames struct {
	Name, MetricsService, NATSSecret, ClustersConfigMap string
	MigrateJob, BackupCronJob, BackupDir                string
	DataDir, TLSDir, SecretsDir, ClustersDir            string
	DoorPort, MetricsPort, IssuerPort                   int
}

var serverFixed = serverNames{
	Name: ServerName, MetricsService: ServerMetricsService, NATSSecret: ServerNATSSecret,
	ClustersConfigMap: RunnerClustersConfigMap, MigrateJob: ServerMigrateJob, BackupCronJob: ServerBackupCronJob, BackupDir: "/backup",
	DataDir: "/var/lib/compass", TLSDir: "/etc/compass/tls",
	SecretsDir: "/var/run/secrets/compass/server", ClustersDir: "/etc/compass/clusters",
	DoorPort: 8443, MetricsPort: 9090, IssuerPort: 443,
}

// calloutNames are the callout container's metrics port and its name: 9090
// in its own pod, 9091 beside the Server (whose metrics have 9090).
type calloutNames struct {
	MetricsPort     int
	MetricsPortName string
}

// natsPod are the nats-server pod's paths and day-2 settings.
type natsPod struct {
	ConfigDir, RunDir, PIDFile      string
	LameDuckDuration, LameDuckGrace string
	TerminationGraceSeconds         int
	ReloadEverySeconds              int
	ReloaderScript                  string
	// WatchedFiles are the files the reloader watches: the configuration
	// and every certificate and key it names.
	WatchedFiles []string
}

// Lame duck and reload settings of the rendered nats-server pods.
const (
	// natsLameDuckDuration is lame_duck_duration, the whole of lame duck
	// mode: it stops accepting clients, waits natsLameDuckGrace (the time
	// the clients' INFO, ldm: true, has to reach them), then closes its
	// clients spread over the rest, 20 s, so their reconnects (and the
	// callout's authorizations) arrive at the other nodes a few at a time,
	// not at once. nats-server requires the grace to be shorter.
	natsLameDuckDuration = 30 * time.Second
	natsLameDuckGrace    = 10 * time.Second
	// natsTerminationGrace leaves lame duck mode room to finish, and
	// nats-server room to exit, before the kubelet's SIGKILL.
	natsTerminationGrace = natsLameDuckDuration + 30*time.Second
	// natsReloadEvery is how often the reloader compares the watched files:
	// a renewed certificate is served within it after the kubelet has
	// updated the Secret's files (its own sync, about a minute).
	natsReloadEvery = 10 * time.Second
)

// natsReloaderScript is the reloader container's program (sh -c, the nats
// image's busybox): every $COMPASS_NATS_RELOAD_EVERY seconds it hashes the
// watched files (its arguments) and, when they changed, sends nats-server
// the reload signal through its pid file. A failed signal (nats-server not
// up yet) is tried again on the next round. A configuration nats-server
// cannot reload is refused by nats-server itself, which logs why and keeps
// the one it runs.
const natsReloaderScript = `set -u
sum() { cat "$@" 2>/dev/null | md5sum; }
last=$(sum "$@")
while sleep "$COMPASS_NATS_RELOAD_EVERY"; do
  now=$(sum "$@")
  [ "$now" = "$last" ] && continue
  if nats-server --signal "reload=$COMPASS_NATS_PID_FILE"; then
    echo "reloader: the configuration or a certificate changed: nats-server reloads"
    last=$now
  fi
done`

// natsNames are the fixed names and paths the templates share.
type natsNames struct {
	UsersSecret, RouteSecret, RouteUser string
	TLSDir, RouteTLSDir                 string
	RoutePasswordEnv, RouteURLsEnv      string
	ServerNameEnv, PodIPEnv             string
	Headless                            string
	ClientPort, RoutePort, MonitorPort  int
}

var names = natsNames{
	UsersSecret: NATSUsersSecret, RouteSecret: NATSRouteSecret, RouteUser: NATSRouteUser,
	TLSDir: natsTLSDir, RouteTLSDir: natsRouteTLSDir,
	RoutePasswordEnv: natsRoutePasswordEnv, RouteURLsEnv: natsRouteURLsEnv,
	ServerNameEnv: natsServerNameEnv, PodIPEnv: podIPEnv,
	Headless:   natsHeadlessService,
	ClientPort: 4222, RoutePort: 6222, MonitorPort: 8222,
}

const (
	// natsTLSDir and natsRouteTLSDir are where the client and route
	// certificate Secrets are mounted in the nats-server pod.
	natsTLSDir      = "/etc/nats/tls"
	natsRouteTLSDir = "/etc/nats/route-tls"
	// natsConfigDir is where the configuration ConfigMap is mounted, as a
	// directory; natsRunDir the pod's emptyDir for nats-server's pid file.
	natsConfigDir = "/etc/nats/config"
	natsRunDir    = "/var/run/nats"
	// natsRoutePasswordEnv holds the route password (from NATSRouteSecret);
	// natsRouteURLsEnv the route URLs built from it by the kubelet's $(VAR)
	// expansion, which needs the password defined first. The names sort in
	// that order too, as the Helm chart writes its env map sorted by name.
	natsRoutePasswordEnv = "COMPASS_NATS_ROUTE_PASSWORD"
	natsRouteURLsEnv     = "COMPASS_NATS_ROUTE_URLS"
	// natsServerNameEnv is each cluster server's name, its pod's name.
	natsServerNameEnv = "COMPASS_NATS_SERVER_NAME"
	// podIPEnv is the pod's IP from the downward API; the Runner's health and
	// the callout's metrics listeners bind it.
	podIPEnv = "COMPASS_POD_IP"
	// natsHeadlessService is the cluster's headless Service: it gives every
	// StatefulSet pod its stable name nats-<i>.nats-headless.<namespace>.svc.
	natsHeadlessService = "nats-headless"
	// authTimeoutSeconds: see deploy/nats/README.md (Auth timeout).
	authTimeoutSeconds = 5
)

// Render validates p and renders the manifests as one multi-document YAML
// stream: the Runner's namespace, admission policy and binding, ServiceAccount
// and DaemonSet; then the callout's namespace, ServiceAccount, nats-server
// ConfigMap, Deployment, PodDisruptionBudget and metrics Service; then, when
// p.NATSImage is set, a nats-server Deployment and Service, or for a cluster
// a StatefulSet, its headless Service, the client Service and a
// PodDisruptionBudget; then, when p.ServerImage is set, the Server
// (ServiceAccount, a Deployment on PostgreSQL or a StatefulSet on SQLite with
// a migrating init container, door and metrics Services, a
// PodDisruptionBudget); then, with p.NetworkPolicies, a NetworkPolicy for
// each of the Server, the callout and nats-server; and with
// p.ServiceMonitor, a ServiceMonitor for each metrics Service and a
// PodMonitor for the Runners; with p.PrometheusRule, the alerting rules; with
// p.GrafanaDashboard, the dashboard's ConfigMap (deploy/monitoring).
func Render(p Params) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	v, err := newView(p)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for _, name := range []string{"runner.yaml.tmpl", "callout.yaml.tmpl", "server.yaml.tmpl", "server-backup-cronjob.yaml.tmpl", "network-policies.yaml.tmpl", "service-monitors.yaml.tmpl"} {
		if err := templates.ExecuteTemplate(&buf, name, v); err != nil {
			return nil, fmt.Errorf("deploy: render %s: %w", name, err)
		}
	}
	return buf.Bytes(), nil
}

// RenderMigrateJob validates p and renders only the Server's migrate Job
// (compass-server manifests --migrate-job): compass-server migrate with the
// Server's image and database settings, the deliberate step of an upgrade
// (docs/store.md). It needs p.ServerImage.
func RenderMigrateJob(p Params) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.ServerImage == "" {
		return nil, fmt.Errorf("%w: --migrate-job: the migrate Job is the Server's: give --server-image (the release to migrate to) and the Server's database flags", ErrInvalidParams)
	}
	v, err := newView(p)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := templates.ExecuteTemplate(&buf, "server-migrate-job", v); err != nil {
		return nil, fmt.Errorf("deploy: render the migrate Job: %w", err)
	}
	return buf.Bytes(), nil
}

// RenderNATSConfig validates p and renders only the nats-server configuration
// that Render puts in the compass-nats-config ConfigMap.
func RenderNATSConfig(p Params) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	v, err := newView(p)
	if err != nil {
		return nil, err
	}
	return []byte(v.NATSConfig), nil
}

// RenderNATSHelmValues validates p and renders values for the official nats
// Helm chart (nats-io/k8s, chart nats, 1.x) that carry the configuration
// RenderNATSConfig renders: client TLS, the monitoring endpoint, the
// accounts, the auth_callout block and, for a cluster, route TLS, the route
// user and the routes, with every secret read from the environment the
// values give the chart's container.
func RenderNATSHelmValues(p Params) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	v, err := newView(p)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := templates.ExecuteTemplate(&buf, "nats-helm-values.yaml.tmpl", v); err != nil {
		return nil, fmt.Errorf("deploy: render nats-helm-values.yaml.tmpl: %w", err)
	}
	return buf.Bytes(), nil
}

func newView(p Params) (view, error) {
	v := view{
		Params:                  p,
		PolicyName:              PolicyName,
		ServiceAccount:          RunnerServiceAccount,
		DaemonSet:               RunnerDaemonSet,
		Audience:                TokenAudience,
		TokenDir:                TokenDir,
		TokenPath:               TokenPath,
		TokenExpirationSeconds:  int64(p.TokenExpiration / time.Second),
		MaxTokenLifetimeSeconds: int64(p.MaxTokenLifetime / time.Second),
		ControllersCEL:          celStringList(p.Controllers),
		DeployersCEL:            celStringList(p.Deployers),
		NATSServers:             p.natsServers(),
		AuthTimeoutSeconds:      authTimeoutSeconds,
		Names:                   names,
		ServerReplicas:          p.serverReplicas(),
		ServerSQLite:            p.ServerDatabaseSecret == "",
		NATSURLPorts:            natsURLPorts(p.NATSURL),
		Server:                  serverFixed,
		CalloutInServerPod:      p.ServerImage != "" && p.ServerDatabaseSecret == "",
		Callout:                 calloutNames{MetricsPort: 9090, MetricsPortName: "metrics"},
		BackupKeepCopies:        cmp.Or(p.BackupKeep, DefaultBackupKeep),
	}
	if v.CalloutInServerPod {
		v.Callout = calloutNames{MetricsPort: 9091, MetricsPortName: "callout-metrics"}
	}
	v.NATS = natsPod{
		ConfigDir: natsConfigDir, RunDir: natsRunDir, PIDFile: natsRunDir + "/nats.pid",
		LameDuckDuration: natsLameDuckDuration.String(), LameDuckGrace: natsLameDuckGrace.String(),
		TerminationGraceSeconds: int(natsTerminationGrace / time.Second),
		ReloadEverySeconds:      int(natsReloadEvery / time.Second),
		ReloaderScript:          natsReloaderScript,
		WatchedFiles:            []string{natsConfigDir + "/nats.conf", natsTLSDir + "/tls.crt", natsTLSDir + "/tls.key"},
	}
	v.NATSHelmImage.Repository, v.NATSHelmImage.Tag, _ = strings.Cut(NATSImage, ":")
	v.NATSClustered = v.NATSServers > 1
	if v.NATSClustered {
		v.NATS.WatchedFiles = append(v.NATS.WatchedFiles, natsRouteTLSDir+"/tls.crt", natsRouteTLSDir+"/tls.key", natsRouteTLSDir+"/ca.crt")
	}
	mv, err := newMonitoringView(p)
	if err != nil {
		return view{}, err
	}
	v.monitoringView = mv
	switch p.NATSMonitor {
	case "", NATSMonitorLoopback:
		v.NATSMonitorListen = fmt.Sprintf("127.0.0.1:%d", names.MonitorPort)
	case NATSMonitorPod:
		v.NATSMonitorListen = fmt.Sprintf("0.0.0.0:%d", names.MonitorPort)
	}
	if v.NATSClustered {
		urls := make([]string, v.NATSServers)
		for i := range v.NATSServers {
			peer := fmt.Sprintf("nats-%d.%s.%s.svc:%d", i, natsHeadlessService, p.CalloutNamespace, names.RoutePort)
			v.NATSPeers = append(v.NATSPeers, peer)
			urls[i] = fmt.Sprintf("%q", "tls://"+NATSRouteUser+":$("+natsRoutePasswordEnv+")@"+peer)
		}
		// A nats-server array of quoted strings, read by nats-server from the
		// environment (routes: $COMPASS_NATS_ROUTE_URLS).
		v.NATSRouteURLs = "[" + strings.Join(urls, ", ") + "]"
	}
	if v.NATSCalloutIssuer == "" {
		v.NATSCalloutIssuer = PlaceholderIssuer
	}
	if v.NATSCalloutXKey == "" {
		v.NATSCalloutXKey = PlaceholderXKey
	}
	var conf bytes.Buffer
	if err := templates.ExecuteTemplate(&conf, "nats-server.conf.tmpl", v); err != nil {
		return view{}, fmt.Errorf("deploy: render nats-server.conf.tmpl: %w", err)
	}
	v.NATSConfig = conf.String()
	return v, nil
}

// natsURLPorts returns the distinct ports of raw's URLs, sorted (4222 for a
// URL without one). Validate has checked every URL.
func natsURLPorts(raw string) []int {
	var ports []int
	for _, part := range strings.Split(raw, ",") {
		port := names.ClientPort
		if u, err := url.Parse(part); err == nil && u.Port() != "" {
			if n, err := strconv.Atoi(u.Port()); err == nil {
				port = n
			}
		}
		if !slices.Contains(ports, port) {
			ports = append(ports, port)
		}
	}
	slices.Sort(ports)
	return ports
}

// celStringList writes names as a CEL list of single-quoted string literals.
// validUsers has refused every name holding a quote, a backslash or a
// non-printable character, so no name can end or escape its literal.
func celStringList(names []string) string {
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = "'" + n + "'"
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// quote writes s as a YAML double-quoted scalar (a JSON string is one).
func quote(s string) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return "", fmt.Errorf("deploy: quote: %w", err)
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}

// indent prefixes every non-empty line of s with n spaces (for block scalars).
func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = pad + l
		}
	}
	return strings.Join(lines, "\n")
}
