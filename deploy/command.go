package deploy

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/compass-runner/identity/deploy/chart"
)

// listFlag is a repeatable string flag; the first use replaces the default.
type listFlag struct {
	vals *[]string
	set  bool
}

func (l *listFlag) String() string {
	if l == nil || l.vals == nil {
		return ""
	}
	return strings.Join(*l.vals, ",")
}

func (l *listFlag) Set(s string) error {
	if !l.set {
		*l.vals = nil
		l.set = true
	}
	*l.vals = append(*l.vals, s)
	return nil
}

// MigrateJobUsage is the --migrate-job flag's usage.
const MigrateJobUsage = "print only the Server's migrate Job (compass-server migrate with --server-image and the Server's database flags),\nto apply after a backup before rolling the Servers onto that image (docs/store.md, Upgrading)"

// ManifestsHelp explains `compass-server manifests`.
const ManifestsHelp = `Prints the Kubernetes manifests for Runner identity (DL-440) as one YAML stream:
the Runner namespace, the compass-runner-identity ValidatingAdmissionPolicy and
its binding, the binding-free compass-runner ServiceAccount, the compass-runner
DaemonSet with its projected token, and compass-callout (Deployment,
PodDisruptionBudget, metrics Service, nats-server ConfigMap); with --nats-image,
an in-cluster nats-server too, one server or, with --nats-cluster, a cluster;
with --server-image, the Server (on PostgreSQL with --server-database-secret,
else SQLite); NetworkPolicies for all of them (--network-policies=false: none);
with --service-monitor, ServiceMonitors and a PodMonitor (--prometheus-rule: the
alerts; --grafana-dashboard: the dashboard; --monitoring-label: their labels).
With --nats-helm-values it prints values for the official nats Helm chart
instead, carrying the same nats-server configuration; with --migrate-job, only
the Server's migrate Job, the deliberate step of an upgrade (the Server's pods
only check the schema and refuse a mismatch). Every parameter is
validated before anything is printed.

--values FILE (repeatable, as helm -f) reads values of the chart
deploy/chart/compass that no flag sets: commonLabels, commonAnnotations,
imagePullPolicy, imagePullSecrets, and per workload tolerations, nodeSelector,
affinity, priorityClassName, resources, podLabels and podAnnotations
(docs/helm.md). A later file's values win. A value a flag sets (clusterName,
the namespaces, the images, ...) is refused in a file, naming the flag: the
flags, and the checks above, decide those alone. Secrets are referenced by name, never
rendered: create them as docs/self-host.md describes.

Apply it as one of the --deployer identities, for example:
  compass-server manifests --cluster-name prod-eks --server-url https://compass.example.com \
    --nats-url tls://nats.example.com:4222 | kubectl apply -f -`

const manifestsUsage = "Usage: compass-server manifests [flags] > compass.yaml\n\n" + ManifestsHelp + "\n\nFlags:\n"

// ManifestsOptions are manifests' flags beside Params: what it prints, and
// the values files laid under the flags.
type ManifestsOptions struct {
	NATSHelmValues bool     // --nats-helm-values
	MigrateJob     bool     // --migrate-job
	ValuesFiles    []string // --values, in the order given
}

// ManifestsOptionFlags registers --nats-helm-values, --migrate-job and
// --values on fs and returns the options they fill.
func ManifestsOptionFlags(fs *flag.FlagSet) *ManifestsOptions {
	o := &ManifestsOptions{}
	fs.BoolVar(&o.NATSHelmValues, "nats-helm-values", false, NATSHelmValuesUsage)
	fs.BoolVar(&o.MigrateJob, "migrate-job", false, MigrateJobUsage)
	fs.Var(valuesFlag{&o.ValuesFiles}, "values", ValuesUsage)
	return o
}

// RenderManifests is what manifests prints for p and o: the manifests, or
// with o.MigrateJob only the migrate Job, each with the values files' values
// (ReadValuesFiles) laid under p's; or with o.NATSHelmValues the nats chart's
// values, which no values file of this chart changes (one is refused).
func RenderManifests(p Params, o ManifestsOptions) ([]byte, error) {
	if p.CABundleFile != "" {
		b, err := os.ReadFile(p.CABundleFile)
		if err != nil {
			return nil, fmt.Errorf("%w: CA bundle: --ca-bundle-file: %w", ErrInvalidParams, err)
		}
		p.CABundle = string(b)
	}
	switch {
	case o.NATSHelmValues && o.MigrateJob:
		return nil, fmt.Errorf("%w: --nats-helm-values and --migrate-job each print one thing: give one", ErrInvalidParams)
	case o.NATSHelmValues && len(o.ValuesFiles) > 0:
		return nil, fmt.Errorf("%w: --values sets this chart's values; --nats-helm-values prints the nats chart's: give one", ErrInvalidParams)
	case o.NATSHelmValues:
		return RenderNATSHelmValues(p)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	extra, err := ReadValuesFiles(p, o.ValuesFiles)
	if err != nil {
		return nil, err
	}
	render := RenderValues
	if o.MigrateJob {
		render = RenderMigrateJobValues
	}
	out, err := render(p, extra)
	if err != nil && len(o.ValuesFiles) > 0 && errors.Is(err, chart.ErrInvalidValues) {
		// The files' values, merged, are what the chart refused.
		return nil, fmt.Errorf("%w (the values of --values %s)", err, strings.Join(o.ValuesFiles, ", "))
	}
	return out, err
}

// ManifestsCommand is `compass-server manifests`: it parses args into Params
// (starting from DefaultParams), renders them and writes the stream to stdout.
// Usage and errors go to stderr. -h/--help returns flag.ErrHelp.
func ManifestsCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("deploy: manifests: %w", err)
	}
	fs := flag.NewFlagSet("manifests", flag.ContinueOnError)
	p := ManifestFlags(fs)
	o := ManifestsOptionFlags(fs)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, manifestsUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("deploy: manifests: %w", err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("deploy: manifests: unexpected argument %q", fs.Arg(0))
	}
	out, err := RenderManifests(*p, *o)
	if err != nil {
		return err
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("deploy: manifests: write: %w", err)
	}
	return nil
}

// ManifestFlags registers the manifests command's flags on fs and returns the
// Params they fill, starting from DefaultParams without its example cluster
// name and Server URL: those two are this installation's and have no default
// (a bare manifests is refused, naming them).
func ManifestFlags(fs *flag.FlagSet) *Params {
	p := DefaultParams()
	p.ClusterName, p.ServerURL = "", ""
	fs.StringVar(&p.Namespace, "namespace", p.Namespace, "Runner namespace: holds only the Runner's ServiceAccount and DaemonSet, no RoleBinding")
	fs.StringVar(&p.CalloutNamespace, "callout-namespace", p.CalloutNamespace, "namespace for compass-callout (and nats-server with --nats-image); must differ from --namespace")
	fs.StringVar(&p.ClusterName, "cluster-name", p.ClusterName, "this cluster's name in the Server's cluster file, [a-z0-9-]{1,40} (required)")
	fs.StringVar(&p.RunnerImage, "runner-image", p.RunnerImage, "compass-runner image, with a tag or digest")
	fs.StringVar(&p.CalloutImage, "callout-image", p.CalloutImage, "compass-callout image, with a tag or digest")
	fs.StringVar(&p.NATSImage, "nats-image", p.NATSImage, "nats-server image; when set, an in-cluster nats-server is rendered (empty: bring your own NATS)")
	fs.StringVar(&p.ServerURL, "server-url", p.ServerURL, "the Server's door, https:// (required)")
	fs.StringVar(&p.NATSURL, "nats-url", p.NATSURL, "NATS URL(s), comma-separated, nats:// or tls://")
	fs.DurationVar(&p.MaxTokenLifetime, "max-token-lifetime", p.MaxTokenLifetime, "this cluster's maxTokenLifetime in the cluster file (at least 600s)")
	fs.DurationVar(&p.TokenExpiration, "token-expiration", p.TokenExpiration, "projected token expirationSeconds, in [600s, --max-token-lifetime]")
	fs.Var(&listFlag{vals: &p.Controllers}, "controller", "username allowed to create Runner pods (repeat; default: "+strings.Join(DefaultControllers, ", ")+")")
	fs.Var(&listFlag{vals: &p.Deployers}, "deployer", "username allowed to create or change the DaemonSet (repeat; default: "+strings.Join(DefaultDeployers, ", ")+")")
	fs.StringVar(&p.PriorityClassName, "priority-class", p.PriorityClassName, "priorityClassName for Runner pods (the PriorityClass is not rendered)")
	fs.StringVar(&p.CABundleFile, "ca-bundle-file", p.CABundleFile, "PEM file with the CA of the Server's and NATS's certificates: rendered as ConfigMap compass-ca (key ca.crt) in both namespaces, mounted at /etc/compass/ca/ca.crt (not with --ca-configmap)")
	fs.StringVar(&p.CABundleConfigMap, "ca-configmap", p.CABundleConfigMap, "ConfigMap of yours (key ca.crt, in both namespaces) with the CA of the Server's and NATS's certificates (empty, and no --ca-bundle-file: system roots)")
	fs.IntVar(&p.CalloutReplicas, "callout-replicas", p.CalloutReplicas, "compass-callout replicas, at least 2")
	fs.StringVar(&p.NATSAccount, "nats-account", p.NATSAccount, "NATS account the callout issues Runner user JWTs for")
	fs.StringVar(&p.NATSCalloutIssuer, "nats-callout-issuer", p.NATSCalloutIssuer, "public account nkey (A...) of the callout's signing seed (empty: a placeholder nats-server refuses)")
	fs.StringVar(&p.NATSCalloutXKey, "nats-callout-xkey", p.NATSCalloutXKey, "public curve key (X...) of the callout's xkey seed (empty: a placeholder nats-server refuses)")
	fs.StringVar(&p.NATSTLSSecret, "nats-tls-secret", p.NATSTLSSecret, "Secret (tls.crt, tls.key) with nats-server's certificate for client connections, which are TLS only")
	fs.StringVar(&p.NATSMonitor, "nats-monitor", p.NATSMonitor, "nats-server's monitoring endpoint: loopback (127.0.0.1:8222), off, or pod (every pod address; no authentication)")
	fs.BoolVar(&p.NATSCluster, "nats-cluster", p.NATSCluster, fmt.Sprintf("render the in-cluster nats-server as a cluster (a StatefulSet of --nats-replicas servers, %d by default)", DefaultNATSClusterReplicas))
	fs.IntVar(&p.NATSReplicas, "nats-replicas", p.NATSReplicas, fmt.Sprintf("nats-server replicas: 1 is a single server, 2 to %d a cluster (0: %d with --nats-cluster, else 1)", MaxNATSReplicas, DefaultNATSClusterReplicas))
	fs.StringVar(&p.NATSRouteTLSSecret, "nats-route-tls-secret", p.NATSRouteTLSSecret, "Secret (tls.crt, tls.key, ca.crt) with the certificate a cluster's servers present to each other on routes")
	fs.BoolVar(&p.NATSGateway, "nats-gateway", p.NATSGateway, "join the in-cluster NATS cluster (--nats-image, --nats-cluster) to other regions' as a supercluster, through a gateway over mutual TLS (docs/helm.md)")
	fs.StringVar(&p.NATSGatewayName, "nats-gateway-name", p.NATSGatewayName, "this region's gateway name, which every other region lists (--nats-gateway-remote); a DNS-1123 label of at most 40 characters, different in every region")
	fs.IntVar(&p.NATSGatewayPort, "nats-gateway-port", p.NATSGatewayPort, "the port every server accepts the other regions' gateway connections on")
	fs.StringVar(&p.NATSGatewayTLSSecret, "nats-gateway-tls-secret", p.NATSGatewayTLSSecret, "Secret (tls.crt, tls.key, ca.crt) with the certificate the servers present to other regions' gateways, as server and as client; ca.crt verifies theirs")
	fs.StringVar(&p.NATSGatewayAdvertise, "nats-gateway-advertise", p.NATSGatewayAdvertise, "host:port every server tells the other regions to dial this region's gateway at (a load balancer's; empty: the pod's address)")
	fs.Var(gatewayRemoteFlag{&p.NATSGatewayRemotes}, "nats-gateway-remote", "another region's gateway, NAME=URL[,URL...] with tls://host:port URLs (repeat: every other region)")
	fs.StringVar(&p.ServerImage, "server-image", p.ServerImage, "compass-server image; when set, the Server is rendered in --callout-namespace (empty: the Server runs elsewhere)")
	fs.StringVar(&p.CalloutDatabaseSecret, "callout-database-secret", p.CalloutDatabaseSecret, "Secret (key url) with the PostgreSQL URL of a role granted only SELECT, which compass-callout reads the Server's database through (docs/store.md); empty: the Server's --server-database-secret")
	fs.StringVar(&p.ServerDatabaseSecret, "server-database-secret", p.ServerDatabaseSecret, "Secret (key url) with the Server's PostgreSQL --database-url: a Deployment of --server-replicas (empty: SQLite, a StatefulSet of one with a volume)")
	fs.IntVar(&p.ServerReplicas, "server-replicas", p.ServerReplicas, fmt.Sprintf("Server replicas: %d to %d on PostgreSQL, 1 on SQLite (0: %d on PostgreSQL, 1 on SQLite)", MinServerReplicas, MaxServerReplicas, MinServerReplicas))
	fs.StringVar(&p.ServerTLSSecret, "server-tls-secret", p.ServerTLSSecret, "Secret (tls.crt, tls.key) with the door's certificate")
	fs.StringVar(&p.ServerStorage, "server-storage", p.ServerStorage, "size of the SQLite volume, in Mi or Gi")
	fs.StringVar(&p.BackupSchedule, "backup-schedule", p.BackupSchedule, "cron schedule (\"0 3 * * *\") of a CronJob that backs the Server's SQLite database up into --backup-claim (empty: none; PostgreSQL: pg_dump, docs/store.md)")
	fs.StringVar(&p.BackupClaim, "backup-claim", p.BackupClaim, "existing PersistentVolumeClaim in --callout-namespace the backup CronJob writes compass-<UTC time>.db copies to")
	fs.IntVar(&p.BackupKeep, "backup-keep", p.BackupKeep, fmt.Sprintf("how many backup copies the CronJob keeps (0: %d)", DefaultBackupKeep))
	fs.BoolVar(&p.NetworkPolicies, "network-policies", p.NetworkPolicies, "render NetworkPolicies for the Server, the callout and nats-server (every connection they do not list is denied)")
	fs.Var(&listFlag{vals: &p.DoorIngressCIDRs}, "door-ingress-cidr", "network allowed to reach the door, CIDR (repeat; default: every address)")
	fs.StringVar(&p.MetricsNamespace, "metrics-namespace", p.MetricsNamespace, "namespace whose pods may scrape the metrics ports")
	fs.StringVar(&p.DatabaseCIDR, "database-cidr", p.DatabaseCIDR, "network of PostgreSQL, CIDR, that the Server and the callout may reach (required with --server-database-secret)")
	fs.IntVar(&p.DatabasePort, "database-port", p.DatabasePort, "PostgreSQL's port")
	fs.Var(&listFlag{vals: &p.NATSCIDRs}, "nats-cidr", "network of a NATS run outside these manifests, CIDR, that the callout, the Server and the Runners may reach on the --nats-url ports (repeat; default: every address)")
	fs.Var(&listFlag{vals: &p.DoorEgressCIDRs}, "door-egress-cidr", "network of the door, CIDR, that the Runners may reach on the --server-url port (repeat; default: every address)")
	fs.Var(&listFlag{vals: &p.GatewayCIDRs}, "nats-gateway-cidr", "network of the other regions, CIDR, whose gateway connections nats-server accepts and dials, with --nats-gateway (repeat; default: every address)")
	fs.Var(&listFlag{vals: &p.IssuerCIDRs}, "issuer-cidr", "network of the clusters' issuers (port 443), CIDR (repeat; default: "+strings.Join(DefaultIssuerCIDRs, ", ")+")")
	fs.BoolVar(&p.ServiceMonitor, "service-monitor", p.ServiceMonitor, "render a ServiceMonitor (monitoring.coreos.com/v1) for each metrics Service and a PodMonitor for the Runners")
	fs.BoolVar(&p.PrometheusRule, "prometheus-rule", p.PrometheusRule, "render the alerting rules (deploy/chart/compass/files/compass-rules.yaml) as a PrometheusRule")
	fs.BoolVar(&p.GrafanaDashboard, "grafana-dashboard", p.GrafanaDashboard, "render the Grafana dashboard (deploy/chart/compass/files/dashboard.json) in a ConfigMap labelled grafana_dashboard: \"1\"")
	fs.Var(&listFlag{vals: &p.MonitoringLabels}, "monitoring-label", "extra label key=value on the ServiceMonitors, PodMonitor, PrometheusRule and dashboard ConfigMap, e.g. release=kube-prometheus-stack (repeat)")
	return &p
}

// gatewayRemoteFlag is the repeatable --nats-gateway-remote NAME=URL[,URL...].
type gatewayRemoteFlag struct{ remotes *[]NATSGatewayRemote }

func (g gatewayRemoteFlag) String() string {
	if g.remotes == nil {
		return ""
	}
	var parts []string
	for _, r := range *g.remotes {
		parts = append(parts, r.Name+"="+strings.Join(r.URLs, ","))
	}
	return strings.Join(parts, " ")
}

func (g gatewayRemoteFlag) Set(s string) error {
	name, urls, ok := strings.Cut(s, "=")
	if !ok {
		return errors.New("want NAME=URL[,URL...]: the other region's gateway name, then the URLs its gateway is reached at")
	}
	r := NATSGatewayRemote{Name: name}
	if urls != "" {
		r.URLs = strings.Split(urls, ",")
	}
	*g.remotes = append(*g.remotes, r)
	return nil
}

// NATSHelmValuesUsage describes the --nats-helm-values flag.
const NATSHelmValuesUsage = "print values for the official nats Helm chart (nats-io/k8s, chart nats) with the same nats-server configuration, instead of the manifests"
