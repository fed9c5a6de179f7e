package deploy

import (
	"cmp"
	"strings"
	"time"
)

// Values returns p as the chart's values (deploy/chart/compass/values.yaml):
// what `helm template` with these values renders is what Render renders
// from p (test/helm). Every value is set, so no default of the chart's
// decides what a flag of manifests meant.
func (p Params) Values() map[string]any {
	return map[string]any{
		"clusterName": p.ClusterName,
		"serverURL":   p.ServerURL,
		"natsURL":     p.NATSURL,
		"namespaces":  map[string]any{"runner": p.Namespace, "callout": p.CalloutNamespace},
		"token": map[string]any{
			"expirationSeconds":  int64(p.TokenExpiration / time.Second),
			"maxLifetimeSeconds": int64(p.MaxTokenLifetime / time.Second),
		},
		"policy":            map[string]any{"controllers": strs(p.Controllers), "deployers": strs(p.Deployers)},
		"caBundle":          p.CABundle,
		"caBundleConfigMap": p.CABundleConfigMap,
		"runner": map[string]any{
			"image":             imageValues(p.RunnerImage),
			"priorityClassName": p.PriorityClassName,
		},
		"callout": map[string]any{
			"image":    imageValues(p.CalloutImage),
			"replicas": p.CalloutReplicas,
			"account":  p.NATSAccount,
			"issuer":   p.NATSCalloutIssuer,
			"xkey":     p.NATSCalloutXKey,
		},
		"nats": map[string]any{
			"enabled":        p.NATSImage != "",
			"image":          imageValues(cmp.Or(p.NATSImage, NATSImage)),
			"cluster":        p.NATSCluster,
			"replicas":       p.NATSReplicas,
			"tlsSecret":      p.NATSTLSSecret,
			"routeTLSSecret": p.NATSRouteTLSSecret,
			"monitor":        cmp.Or(p.NATSMonitor, NATSMonitorLoopback),
			"gateway": map[string]any{
				"enabled":   p.NATSGateway,
				"name":      p.NATSGatewayName,
				"port":      cmp.Or(p.NATSGatewayPort, DefaultNATSGatewayPort),
				"tlsSecret": p.NATSGatewayTLSSecret,
				"advertise": p.NATSGatewayAdvertise,
				"remotes":   gatewayRemoteValues(p.NATSGatewayRemotes),
			},
		},
		"server": map[string]any{
			"enabled":               p.ServerImage != "",
			"image":                 imageValues(cmp.Or(p.ServerImage, ImageRepository+"/compass-server:"+ImageVersion)),
			"databaseSecret":        p.ServerDatabaseSecret,
			"calloutDatabaseSecret": p.CalloutDatabaseSecret,
			"replicas":              p.ServerReplicas,
			"tlsSecret":             p.ServerTLSSecret,
			"storage":               map[string]any{"size": p.ServerStorage},
			"backup":                map[string]any{"schedule": p.BackupSchedule, "claim": p.BackupClaim, "keep": p.BackupKeep},
		},
		"networkPolicies": map[string]any{
			"enabled":          p.NetworkPolicies,
			"doorIngressCIDRs": strs(p.DoorIngressCIDRs),
			"metricsNamespace": p.MetricsNamespace,
			"databaseCIDR":     p.DatabaseCIDR,
			"databasePort":     p.DatabasePort,
			"issuerCIDRs":      strs(p.IssuerCIDRs),
			"natsCIDRs":        strs(p.NATSCIDRs),
			"doorEgressCIDRs":  strs(p.DoorEgressCIDRs),
			"gatewayCIDRs":     strs(p.GatewayCIDRs),
		},
		"monitoring": map[string]any{
			"serviceMonitor":   p.ServiceMonitor,
			"prometheusRule":   p.PrometheusRule,
			"grafanaDashboard": p.GrafanaDashboard,
			"labels":           monitoringLabelValues(p.MonitoringLabels),
		},
	}
}

// strs is names as a list value: never null, so an empty list replaces the
// chart's default rather than deleting it.
func strs(names []string) []any {
	out := make([]any, len(names))
	for i, n := range names {
		out[i] = n
	}
	return out
}

// gatewayRemoteValues are the remote gateways as the chart's list of
// {name, urls}: never null, as strs.
func gatewayRemoteValues(remotes []NATSGatewayRemote) []any {
	out := make([]any, len(remotes))
	for i, r := range remotes {
		out[i] = map[string]any{"name": r.Name, "urls": strs(r.URLs)}
	}
	return out
}

// imageValues splits an image reference into the chart's registry,
// repository, tag and digest, which compass.image joins back into ref.
func imageValues(ref string) map[string]any {
	rest, digest, _ := strings.Cut(ref, "@")
	tag := ""
	if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		rest, tag = rest[:i], rest[i+1:]
	}
	registry, repository := "", rest
	if i := strings.LastIndex(rest, "/"); i >= 0 {
		registry, repository = rest[:i], rest[i+1:]
	}
	return map[string]any{"registry": registry, "repository": repository, "tag": tag, "digest": digest}
}

// monitoringLabelValues are --monitoring-label's key=value pairs as a map;
// validMonitoringLabels has checked them.
func monitoringLabelValues(kvs []string) map[string]any {
	out := map[string]any{}
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}
