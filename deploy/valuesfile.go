package deploy

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// ValuesUsage is the --values flag's usage.
const ValuesUsage = "a values `FILE` of the chart deploy/chart/compass (YAML, as helm -f; repeat, a later file's values win):\n" +
	"the values no flag sets, such as commonLabels, imagePullSecrets, tolerations or resources (docs/helm.md).\n" +
	"A value a flag sets (clusterName, the images, ...) is refused in a file, naming its flag: give the flag"

// valuesFlag is the repeatable --values flag: the files, in the order given.
type valuesFlag struct{ files *[]string }

func (v valuesFlag) String() string {
	if v.files == nil {
		return ""
	}
	return strings.Join(*v.files, ",")
}

func (v valuesFlag) Set(s string) error {
	if s == "" {
		return errors.New("empty: name a values file")
	}
	*v.files = append(*v.files, s)
	return nil
}

// valueFlags names, for each chart value that Params.Values sets, the
// manifests flag that sets it. A values file may not set these: the flag's
// value, checked by Validate, is what renders. A value that Values sets as a
// whole (an image, the monitoring labels) is named here whole, so a file can
// set none of its parts. TestValueFlagsNameEveryFlagValue keeps the map and
// Values in step.
var valueFlags = map[string]string{
	"clusterName":                      "--cluster-name",
	"serverURL":                        "--server-url",
	"natsURL":                          "--nats-url",
	"namespaces.runner":                "--namespace",
	"namespaces.callout":               "--callout-namespace",
	"token.expirationSeconds":          "--token-expiration",
	"token.maxLifetimeSeconds":         "--max-token-lifetime",
	"policy.controllers":               "--controller",
	"policy.deployers":                 "--deployer",
	"caBundle":                         "--ca-bundle-file",
	"caBundleConfigMap":                "--ca-configmap",
	"runner.image":                     "--runner-image",
	"runner.priorityClassName":         "--priority-class",
	"callout.image":                    "--callout-image",
	"callout.replicas":                 "--callout-replicas",
	"callout.account":                  "--nats-account",
	"callout.issuer":                   "--nats-callout-issuer",
	"callout.xkey":                     "--nats-callout-xkey",
	"nats.enabled":                     "--nats-image",
	"nats.image":                       "--nats-image",
	"nats.cluster":                     "--nats-cluster",
	"nats.replicas":                    "--nats-replicas",
	"nats.tlsSecret":                   "--nats-tls-secret",
	"nats.routeTLSSecret":              "--nats-route-tls-secret",
	"nats.monitor":                     "--nats-monitor",
	"nats.gateway.enabled":             "--nats-gateway",
	"nats.gateway.name":                "--nats-gateway-name",
	"nats.gateway.port":                "--nats-gateway-port",
	"nats.gateway.tlsSecret":           "--nats-gateway-tls-secret",
	"nats.gateway.advertise":           "--nats-gateway-advertise",
	"nats.gateway.remotes":             "--nats-gateway-remote",
	"server.enabled":                   "--server-image",
	"server.image":                     "--server-image",
	"server.databaseSecret":            "--server-database-secret",
	"server.calloutDatabaseSecret":     "--callout-database-secret",
	"server.replicas":                  "--server-replicas",
	"server.tlsSecret":                 "--server-tls-secret",
	"server.storage.size":              "--server-storage",
	"server.backup.schedule":           "--backup-schedule",
	"server.backup.claim":              "--backup-claim",
	"server.backup.keep":               "--backup-keep",
	"server.migrateJob":                "--migrate-job",
	"networkPolicies.enabled":          "--network-policies",
	"networkPolicies.doorIngressCIDRs": "--door-ingress-cidr",
	"networkPolicies.metricsNamespace": "--metrics-namespace",
	"networkPolicies.databaseCIDR":     "--database-cidr",
	"networkPolicies.databasePort":     "--database-port",
	"networkPolicies.issuerCIDRs":      "--issuer-cidr",
	"networkPolicies.natsCIDRs":        "--nats-cidr",
	"networkPolicies.doorEgressCIDRs":  "--door-egress-cidr",
	"networkPolicies.gatewayCIDRs":     "--nats-gateway-cidr",
	"monitoring.serviceMonitor":        "--service-monitor",
	"monitoring.prometheusRule":        "--prometheus-rule",
	"monitoring.grafanaDashboard":      "--grafana-dashboard",
	"monitoring.labels":                "--monitoring-label",
}

// ReadValuesFiles reads manifests' --values files in order, each laid over
// the ones before as helm -f does (maps merge, anything else is replaced),
// and refuses a file that sets a value p's flags set: without that, a file
// could put into the manifests a cluster name, an image or a namespace that
// Validate never saw (the flags are laid over the files, so it would be
// overridden at best, and silently). Every error names the file.
func ReadValuesFiles(p Params, paths []string) (map[string]any, error) {
	base := p.Values()
	merged := map[string]any{}
	for _, path := range paths {
		raw, err := os.ReadFile(path)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, fmt.Errorf("%w: --values %s: %w", ErrInvalidParams, path, err)
		}
		var vals map[string]any
		if err := yaml.Unmarshal(raw, &vals); err != nil {
			return nil, fmt.Errorf("%w: --values %s: not a YAML map of chart values: %w", ErrInvalidParams, path, err)
		}
		if err := refuseFlagValues(vals, base, ""); err != nil {
			return nil, fmt.Errorf("%w: --values %s: %w", ErrInvalidParams, path, err)
		}
		merged = mergeValues(merged, vals)
	}
	return merged, nil
}

// refuseFlagValues returns an error for the first value of file (in key
// order) that base, the flags' values, also sets. A map in both is walked;
// anything else in both is a collision, whether or not valueFlags names it.
func refuseFlagValues(file, base map[string]any, prefix string) error {
	for _, k := range slices.Sorted(maps.Keys(file)) {
		path := prefix + k
		if flag, ok := valueFlags[path]; ok {
			return fmt.Errorf("%s is the value of %s: give the flag (a values file holds the values no flag sets)", path, flag)
		}
		bv, ok := base[k]
		if !ok {
			continue
		}
		bm, bok := bv.(map[string]any)
		fm, fok := file[k].(map[string]any)
		if !bok || !fok {
			return fmt.Errorf("%s is set by manifests' flags: give them instead", path)
		}
		if err := refuseFlagValues(fm, bm, path+"."); err != nil {
			return err
		}
	}
	return nil
}
