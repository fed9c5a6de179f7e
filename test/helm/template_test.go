package helm

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/deploy/chart"
	"github.com/compass-runner/identity/deploy/deploytest"
	"github.com/compass-runner/identity/test/natsembed"
)

// chartCase is one configuration rendered both ways: deploy.Params (what
// manifests' flags set) edited from the defaults, and chart-only values laid
// over p.Values() (what a values file given to manifests, or to helm, adds).
type chartCase struct {
	name string
	edit func(p *deploy.Params)
	// extra are chart values no Params field has, given to helm as a second
	// values file and to deploy.RenderValues.
	extra map[string]any
	// minimal gives helm only clusterName and serverURL, so the chart's own
	// values.yaml decides everything else: its defaults must be manifests'.
	minimal bool
	// present and absent are references ("Kind namespace/name") that the
	// rendering must and must not hold, and shows are texts it must print
	// (a value only extra gives): the case renders what it is named for, so
	// two renderings that both dropped it cannot pass as equal.
	present, absent, shows []string
}

func (c chartCase) params() deploy.Params {
	p := deploy.DefaultParams()
	if c.edit != nil {
		c.edit(&p)
	}
	return p
}

// values are the values files, in order, that helm renders the case with.
func (c chartCase) values(p deploy.Params) []map[string]any {
	if c.minimal {
		return []map[string]any{{"clusterName": p.ClusterName, "serverURL": p.ServerURL}}
	}
	vals := []map[string]any{p.Values()}
	if c.extra != nil {
		vals = append(vals, c.extra)
	}
	return vals
}

// publicKeys are a real account nkey and curve key for the callout's
// issuer and xkey (public keys: nothing secret is rendered).
func publicKeys(t *testing.T) (issuer, xkey string) {
	t.Helper()
	acc, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	curve, err := nkeys.CreateCurveKeys()
	if err != nil {
		t.Fatal(err)
	}
	if issuer, err = acc.PublicKey(); err != nil {
		t.Fatal(err)
	}
	if xkey, err = curve.PublicKey(); err != nil {
		t.Fatal(err)
	}
	return issuer, xkey
}

// chartCases are the configurations compared. A configuration the chart
// gains (a value, a template) is a new row here.
func chartCases(t *testing.T) []chartCase {
	issuer, xkey := publicKeys(t)
	recipe, keys := natsembed.NewRecipe(t), natsembed.NewCalloutKeys(t)
	const ns = "compass-system"
	return []chartCase{
		{
			name:    "defaults with the two required values",
			minimal: true,
			present: []string{"DaemonSet compass-runner/compass-runner", "ValidatingAdmissionPolicy compass-runner-identity",
				"Deployment " + ns + "/compass-callout", "NetworkPolicy " + ns + "/compass-callout"},
			absent: []string{"Deployment " + ns + "/nats", "StatefulSet " + ns + "/compass-server"},
		},
		{
			name: "in-cluster NATS, one server, the CA given as PEM",
			edit: func(p *deploy.Params) {
				p.NATSImage = deploy.NATSImage
				p.NATSCalloutIssuer, p.NATSCalloutXKey = issuer, xkey
				p.CABundle = deploytest.CAPEM(t)
			},
			present: []string{"Deployment " + ns + "/nats", "Service " + ns + "/nats", "NetworkPolicy " + ns + "/nats",
				"ConfigMap compass-runner/compass-ca", "ConfigMap " + ns + "/compass-ca"},
			absent: []string{"StatefulSet " + ns + "/nats"},
		},
		{
			name: "in-cluster NATS, a cluster of 5 with the monitor on the pod",
			edit: func(p *deploy.Params) {
				p.NATSImage = deploy.NATSImage
				p.NATSCluster, p.NATSReplicas = true, 5
				p.NATSMonitor = deploy.NATSMonitorPod
				p.NATSRouteTLSSecret = "nats-routes"
				p.ServiceMonitor = true
			},
			present: []string{"StatefulSet " + ns + "/nats", "Service " + ns + "/nats-headless", "PodDisruptionBudget " + ns + "/nats"},
			absent:  []string{"Deployment " + ns + "/nats"},
		},
		{
			name: "Server on SQLite with backup, CA bundle, priority class, token 3600/7200, own identities, all monitoring, door, NATS and door egress CIDRs",
			edit: func(p *deploy.Params) {
				p.ServerImage = deploy.ImageRepository + "/compass-server:" + deploy.ImageVersion
				p.ServerStorage = "5Gi"
				p.BackupSchedule, p.BackupClaim, p.BackupKeep = "15 2 * * *", "compass-backups", 14
				p.CABundleConfigMap = "compass-ca"
				p.PriorityClassName = "system-node-critical"
				p.TokenExpiration, p.MaxTokenLifetime = 3600*time.Second, 7200*time.Second
				p.Controllers = []string{"system:serviceaccount:kube-system:daemon-set-controller", "system:serviceaccount:ops:rollout"}
				p.Deployers = []string{"system:serviceaccount:argocd:argocd-application-controller", "alice@example.com"}
				p.ServiceMonitor, p.PrometheusRule, p.GrafanaDashboard = true, true, true
				p.MonitoringLabels = []string{"release=kube-prometheus-stack", "team.example.com/owner=platform"}
				p.DoorIngressCIDRs = []string{"198.51.100.0/24", "2001:db8::/32"}
				p.NATSCIDRs = []string{"203.0.113.0/24"}
				p.DoorEgressCIDRs = []string{"192.0.2.0/28", "2001:db8:1::/48"}
				p.MetricsNamespace = "prometheus"
			},
			present: []string{"StatefulSet " + ns + "/compass-server", "CronJob " + ns + "/compass-server-backup",
				"ServiceMonitor " + ns + "/compass-server", "PodMonitor " + ns + "/compass-runner",
				"PrometheusRule " + ns + "/compass", "ConfigMap " + ns + "/compass-dashboard"},
			absent: []string{"Deployment " + ns + "/compass-server", "Deployment " + ns + "/compass-callout"},
		},
		{
			name: "Server on PostgreSQL, 3 replicas, the callout's read-only role, two NATS URLs on different ports, no network policies",
			edit: func(p *deploy.Params) {
				p.ServerImage = "registry.example.com:5000/platform/compass-server:v0.1.0"
				p.ServerDatabaseSecret, p.ServerReplicas = "compass-db", 3
				p.CalloutDatabaseSecret = "compass-callout-reader"
				p.DatabaseCIDR, p.DatabasePort = "10.40.0.0/16", 6432
				p.NATSURL = "tls://nats-a.example.com:4222,tls://nats-b.example.com:7422"
				p.NetworkPolicies = false
				p.CalloutReplicas = 3
				p.NATSCalloutIssuer, p.NATSCalloutXKey = issuer, xkey
				p.NATSAccount = "RUNNERS_EU"
			},
			present: []string{"Deployment " + ns + "/compass-server", "Deployment " + ns + "/compass-callout", "Service " + ns + "/compass-server"},
			absent:  []string{"NetworkPolicy " + ns + "/compass-server", "NetworkPolicy " + ns + "/compass-callout", "StatefulSet " + ns + "/compass-server"},
		},
		{
			name: "Server on PostgreSQL with network policies and the database's CIDR and port",
			edit: func(p *deploy.Params) {
				p.ServerImage = deploy.ImageRepository + "/compass-server:" + deploy.ImageVersion
				p.ServerDatabaseSecret = "compass-db"
				p.DatabaseCIDR, p.DatabasePort = "10.40.0.0/16", 6432
				p.IssuerCIDRs = []string{"203.0.113.0/24", "192.0.2.10/32"}
				p.NATSImage = deploy.NATSImage
				p.NATSCluster = true
			},
			present: []string{"NetworkPolicy " + ns + "/compass-server", "NetworkPolicy " + ns + "/compass-callout", "NetworkPolicy " + ns + "/nats"},
		},
		{
			name: "a region of a NATS supercluster: a cluster of 3 with a gateway to two others, advertised through a load balancer, the regions' CIDRs",
			edit: func(p *deploy.Params) {
				p.NATSImage = deploy.NATSImage
				p.NATSCluster = true
				p.NATSCalloutIssuer, p.NATSCalloutXKey = issuer, xkey
				p.NATSGateway, p.NATSGatewayName, p.NATSGatewayPort = true, "us-east", 7443
				p.NATSGatewayTLSSecret = "us-east-gateway"
				p.NATSGatewayAdvertise = "nats-gateway.us-east.example.com:7443"
				p.NATSGatewayRemotes = []deploy.NATSGatewayRemote{
					{Name: "eu-west", URLs: []string{"tls://nats-gateway.eu-west.example.com:7443"}},
					{Name: "ap-south", URLs: []string{"tls://203.0.113.9:443", "nats://[2001:db8::9]:7443"}},
				}
				p.GatewayCIDRs = []string{"203.0.113.0/24", "2001:db8::/32"}
			},
			extra: map[string]any{"nats": map[string]any{"gateway": map[string]any{
				"serviceType":        "LoadBalancer",
				"serviceAnnotations": map[string]any{"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"},
			}}},
			present: []string{"StatefulSet " + ns + "/nats", "Service " + ns + "/nats-headless", "Service " + ns + "/nats-gateway", "NetworkPolicy " + ns + "/nats"},
			shows:   []string{"reject_unknown_cluster: true", `{ name: "ap-south", urls: ["tls://203.0.113.9:443", "nats://[2001:db8::9]:7443"] }`, "$(COMPASS_NATS_POD_NAME).us-east", "aws-load-balancer-type", "externalTrafficPolicy: Local"},
		},
		{
			name: "images by digest in their own namespaces, NATS monitor off",
			edit: func(p *deploy.Params) {
				const digest = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
				p.Namespace, p.CalloutNamespace = "runners", "compass"
				p.RunnerImage = "registry.example.com:5000/team/compass-runner" + digest
				p.CalloutImage = "ghcr.io/compass-runner/compass-callout:v0.1.0" + digest
				p.NATSImage = "nats" + digest
				p.NATSURL = "tls://nats.compass.svc:4222"
				p.NATSMonitor = deploy.NATSMonitorOff
				p.NATSTLSSecret = "nats-clients"
			},
			present: []string{"DaemonSet runners/compass-runner", "Deployment compass/nats", "Namespace runners", "Namespace compass"},
			absent:  []string{"Namespace compass-runner", "Namespace compass-system"},
		},
		{
			name: "chart-only values on the Runner and the callout: tolerations, nodeSelector, affinity, pod labels, pull secrets, common labels",
			extra: map[string]any{
				"imagePullSecrets":  []any{"registry-creds"},
				"imagePullPolicy":   "Always",
				"commonLabels":      map[string]any{"team.example.com/owner": "platform"},
				"commonAnnotations": map[string]any{"team.example.com/runbook": "https://runbooks.example.com/compass"},
				"runner": map[string]any{
					"tolerations":    []any{map[string]any{"operator": "Exists"}},
					"nodeSelector":   map[string]any{"kubernetes.io/os": "linux"},
					"podLabels":      map[string]any{"cost-center": "ci-runners"},
					"podAnnotations": map[string]any{"team.example.com/scraped": "yes"},
					"resources":      map[string]any{"requests": map[string]any{"cpu": "75m", "memory": "96Mi"}},
				},
				"callout": map[string]any{
					"tolerations": []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "compass", "effect": "NoSchedule"}},
					"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
						"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
							"key": "node-role.example.com/control", "operator": "DoesNotExist"}}}}}}},
					"priorityClassName": "compass-callout",
					// A key rotation's step 2 (docs/self-host.md).
					"nextXKey": true, "nextIssuer": true,
				},
			},
			present: []string{"DaemonSet compass-runner/compass-runner", "Deployment " + ns + "/compass-callout"},
			shows: []string{"registry-creds", "team.example.com/owner", "team.example.com/runbook", "kubernetes.io/os", "ci-runners",
				"team.example.com/scraped", "75m", "dedicated", "node-role.example.com/control", `priorityClassName: "compass-callout"`, `imagePullPolicy: "Always"`,
				"COMPASS_NEXT_XKEY_SEED_FILE", "COMPASS_NEXT_ISSUER_SEED_FILE"},
		},
		{
			name: "chart-only values on the Server on SQLite, its backup and a NATS cluster: storageClass, scheduling, the spreading replaced",
			edit: func(p *deploy.Params) {
				p.ServerImage = deploy.ImageRepository + "/compass-server:" + deploy.ImageVersion
				p.BackupSchedule, p.BackupClaim = "@daily", "compass-backups"
				p.NATSImage = deploy.NATSImage
				p.NATSCluster = true
			},
			extra: map[string]any{
				"server": map[string]any{
					"storage":           map[string]any{"storageClass": "fast-ssd"},
					"tolerations":       []any{map[string]any{"key": "storage", "operator": "Exists", "effect": "NoSchedule"}},
					"nodeSelector":      map[string]any{"topology.example.com/disk": "ssd"},
					"priorityClassName": "compass-server",
					"podLabels":         map[string]any{"backup.example.com/include": "true"},
				},
				"nats": map[string]any{
					"affinity": map[string]any{"podAntiAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{
						map[string]any{"weight": 50, "podAffinityTerm": map[string]any{
							"topologyKey":   "topology.kubernetes.io/zone",
							"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "nats"}}}}}}},
					"reloaderResources": map[string]any{"limits": map[string]any{"memory": "48Mi"}},
				},
			},
			present: []string{"StatefulSet " + ns + "/compass-server", "CronJob " + ns + "/compass-server-backup", "StatefulSet " + ns + "/nats"},
			shows:   []string{"fast-ssd", "topology.example.com/disk", `priorityClassName: "compass-server"`, "backup.example.com/include", "topology.kubernetes.io/zone", "48Mi"},
		},
		{
			name: "the doors' TokenReview on PostgreSQL, with network policies and the API server's addresses",
			edit: func(p *deploy.Params) {
				p.ServerImage = deploy.ImageRepository + "/compass-server:" + deploy.ImageVersion
				p.ServerDatabaseSecret = "compass-db"
				p.DatabaseCIDR = "10.40.0.0/16"
			},
			extra: map[string]any{
				"tokenReview":     map[string]any{"enabled": true},
				"networkPolicies": map[string]any{"apiServerCIDRs": []any{"10.96.0.1/32", "192.0.2.10/32"}},
			},
			present: []string{"ClusterRole compass-token-reviewer", "ClusterRoleBinding compass-token-reviewer"},
			shows:   []string{"kube-root-ca.crt", "/var/run/secrets/compass/kube", "tokenreviews", "6443"},
		},
		{
			name: "operator mode with the recipe's JWTs, a NATS cluster and the Server on SQLite, in a rotation's step 2",
			edit: func(p *deploy.Params) {
				p.ServerImage = deploy.ImageRepository + "/compass-server:" + deploy.ImageVersion
				p.NATSImage = deploy.NATSImage
				p.NATSCluster = true
				p.NATSAccount = recipe.RunnersPub // --nats-account: in operator mode the account's public key
			},
			extra: map[string]any{
				"callout": map[string]any{"mode": "operator", "calloutAccount": recipe.AuthPub,
					"nextXKey": true, "nextIssuer": true, "nextUserSigning": true},
				"nats": map[string]any{"operator": map[string]any{"resolver": recipe.Resolver(t, keys.XKey, keys), "sentinel": recipe.Sentinel()}},
			},
			present: []string{"StatefulSet " + ns + "/compass-server", "StatefulSet " + ns + "/nats", "ConfigMap " + ns + "/compass-nats-config"},
			shows: []string{"resolver_preload", "default_sentinel", "COMPASS_NATS_CREDS", "COMPASS_KICK_CREDS", "COMPASS_CALLOUT_ACCOUNT",
				"COMPASS_NEXT_USER_SIGNING_SEED_FILE", "compass-callout-user-signing", recipe.AuthPub},
		},
	}
}

// TestHelmTemplateRendersWhatManifestsRenders: for each configuration, the
// pinned helm binary's `helm template` of the chart with p.Values() and the
// case's chart-only values (a second values file) prints the same multiset
// of objects as manifests does with the flags p stands for and the same
// file given to --values (deploy.RenderManifests); and for a configuration
// with the Server, `--set server.migrateJob=true --show-only
// templates/server-migrate-job.yaml` prints the Job manifests --migrate-job
// does. The renderer in deploy/chart reimplements Helm's engine; an
// operator installing with Helm must get the objects every other test
// checks.
func TestHelmTemplateRendersWhatManifestsRenders(t *testing.T) {
	bin := Binary(t)
	dir := EmbeddedChart(t)
	for _, tc := range chartCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.params()
			var opts deploy.ManifestsOptions
			if tc.extra != nil {
				opts.ValuesFiles = WriteValues(t, tc.extra)
			}
			want, err := deploy.RenderManifests(p, opts)
			if err != nil {
				t.Fatalf("manifests: %v", err)
			}
			got := Template(t, bin, dir, tc.values(p))
			compare(t, got, want)
			objs, err := decodeObjects(want)
			if err != nil {
				t.Fatal(err)
			}
			all := refs(objs)
			for _, r := range tc.present {
				if !slices.Contains(all, r) {
					t.Errorf("the rendering holds no %s (it holds %s)", r, strings.Join(all, "; "))
				}
			}
			for _, r := range tc.absent {
				if slices.Contains(all, r) {
					t.Errorf("the rendering holds %s, which this configuration does not render", r)
				}
			}
			for _, text := range tc.shows {
				if !strings.Contains(string(want), text) {
					t.Errorf("the rendering does not print %q, which the case's values give", text)
				}
			}

			if p.ServerImage == "" {
				return
			}
			opts.MigrateJob = true
			job, err := deploy.RenderManifests(p, opts)
			if err != nil {
				t.Fatalf("manifests --migrate-job: %v", err)
			}
			got = Template(t, bin, dir, tc.values(p), "--set", "server.migrateJob=true", "--show-only", "templates/server-migrate-job.yaml")
			jobs := compare(t, got, job)
			if len(jobs) != 1 || jobs[0].ref != "Job compass-system/"+deploy.ServerMigrateJob {
				t.Errorf("the migrate Job rendering is %v, want the Job %s alone", refs(jobs), deploy.ServerMigrateJob)
			}
		})
	}
}

// compare fails the test unless helm's output and manifests' hold the
// same multiset of objects, listing the objects that differ, and returns
// helm's objects.
func compare(t *testing.T, helmOut, manifestsOut []byte) []object {
	t.Helper()
	h, err := decodeObjects(helmOut)
	if err != nil {
		t.Fatalf("helm template's output: %v", err)
	}
	m, err := decodeObjects(manifestsOut)
	if err != nil {
		t.Fatalf("manifests' output: %v", err)
	}
	if len(m) == 0 {
		t.Fatal("manifests rendered no object")
	}
	if d := diffObjects("helm", h, "manifests", m); len(d) > 0 {
		t.Errorf("helm template (%d objects) and manifests (%d objects) differ:\n  %s", len(h), len(m), strings.Join(d, "\n  "))
	}
	return h
}

// TestObjectComparisonNamesWhatDiffers: the comparison the tests above rest
// on tells a rendering from another with one flag changed, naming the
// object and the field (the callout's replicas), and an object one side
// alone prints (a ServiceMonitor), and nothing else. Helm renders one side,
// manifests the other.
func TestObjectComparisonNamesWhatDiffers(t *testing.T) {
	bin := Binary(t)
	p := deploy.DefaultParams()
	q := p
	q.CalloutReplicas = 3
	q.ServiceMonitor = true
	want, err := deploy.Render(p)
	if err != nil {
		t.Fatal(err)
	}
	h, err := decodeObjects(Template(t, bin, EmbeddedChart(t), []map[string]any{q.Values()}))
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeObjects(want)
	if err != nil {
		t.Fatal(err)
	}
	got := diffObjects("helm", h, "manifests", m)
	wantDiff := []string{
		"Deployment compass-system/compass-callout differs at .spec.replicas",
		"PodMonitor compass-system/compass-runner: 1 printed by helm only",
		"ServiceMonitor compass-system/compass-callout: 1 printed by helm only",
	}
	if !slices.Equal(got, wantDiff) {
		t.Errorf("the comparison says\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(wantDiff, "\n  "))
	}
	// The same object printed twice on one side is a difference too.
	if d := diffObjects("helm", append(slices.Clone(m), m[0]), "manifests", m); len(d) != 1 || !strings.Contains(d[0], m[0].ref+": 1 printed by helm only") {
		t.Errorf("a duplicated %s: the comparison says %v", m[0].ref, d)
	}
}

// TestHelmLintPassesForEachCase: `helm lint --strict` (a warning is an
// error) passes the chart with each configuration's values.
func TestHelmLintPassesForEachCase(t *testing.T) {
	bin := Binary(t)
	for _, tc := range chartCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"lint", "--strict", ChartDir(t), "--namespace", Namespace}
			for _, f := range WriteValues(t, tc.values(tc.params())...) {
				args = append(args, "-f", f)
			}
			r := Run(t, bin, args...)
			if r.Err != nil {
				t.Fatalf("helm lint --strict: %v\n%s%s", r.Err, r.Stdout, r.Stderr)
			}
			if !strings.Contains(string(r.Stdout), "1 chart(s) linted, 0 chart(s) failed") {
				t.Errorf("helm lint --strict printed no passing summary:\n%s", r.Stdout)
			}
		})
	}
}

// helm lint --strict fails the chart while either required value is
// missing, naming it: helm's lint turns required and fail into log lines,
// so it is the schema (minLength 1) that makes an unset value a failure.
func TestHelmLintFailsWithoutARequiredValue(t *testing.T) {
	bin := Binary(t)
	for _, tc := range []struct {
		name    string
		values  map[string]any
		missing []string
	}{
		{"no values", map[string]any{}, []string{"clusterName", "serverURL"}},
		{"no server URL", map[string]any{"clusterName": "prod"}, []string{"serverURL"}},
		{"no cluster name", map[string]any{"serverURL": "https://compass.example.com"}, []string{"clusterName"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"lint", "--strict", ChartDir(t), "--namespace", Namespace}
			for _, f := range WriteValues(t, tc.values) {
				args = append(args, "-f", f)
			}
			r := Run(t, bin, args...)
			out := string(r.Stdout) + string(r.Stderr)
			if r.Err == nil || !strings.Contains(out, "1 chart(s) linted, 1 chart(s) failed") {
				t.Fatalf("helm lint --strict passed without %v:\n%s", tc.missing, out)
			}
			for _, v := range tc.missing {
				if !strings.Contains(out, "at '/"+v+"': minLength: got 0, want 1") {
					t.Errorf("helm lint --strict does not name %s:\n%s", v, out)
				}
			}
		})
	}
}

// TestHelmAndManifestsRefuseTheSameBadValues: values the chart refuses
// (its schema, and templates/_validate.tpl's required values and rules over
// several values) are refused by helm template, which exits non-zero naming
// the value and prints no object, and by the chart's renderer, whose error
// is chart.ErrInvalidValues naming the same value. A value only one of them
// refused would install with Helm and not with manifests, or the other way
// round. A credential in a URL is never repeated by either refusal: a
// refusal is logged, and the attacker model includes whoever reads logs.
func TestHelmAndManifestsRefuseTheSameBadValues(t *testing.T) {
	bin := Binary(t)
	dir := EmbeddedChart(t)
	c, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	good := deploy.DefaultParams().Values()
	for _, tc := range []struct {
		name string
		// bad is laid over the good values (a null deletes a value), as a
		// second values file for helm.
		bad map[string]any
		// names is what both refusals must say: the value's name, or its
		// path in the schema's words.
		names string
		// hidden must appear in neither refusal.
		hidden string
	}{
		{"clusterName missing", map[string]any{"clusterName": nil}, "clusterName", ""},
		{"clusterName empty", map[string]any{"clusterName": ""}, "clusterName", ""},
		{"serverURL missing", map[string]any{"serverURL": nil}, "serverURL", ""},
		{"serverURL empty", map[string]any{"serverURL": ""}, "serverURL", ""},
		{"both missing, the first named", map[string]any{"clusterName": nil, "serverURL": nil}, "clusterName", ""},
		{"clusterName with capitals", map[string]any{"clusterName": "Prod"}, "/clusterName", ""},
		{"serverURL in clear text", map[string]any{"serverURL": "http://compass.example.com"}, "/serverURL", ""},
		{"serverURL with a password", map[string]any{"serverURL": "https://admin:door-s3cret@compass.example.com"}, "serverURL", "door-s3cret"},
		{"natsURL with a password", map[string]any{"natsURL": "tls://runner:nats-s3cret@nats.example.com:4222"}, "natsURL", "nats-s3cret"},
		{"natsURL in clear text to another host", map[string]any{"natsURL": "nats://nats.example.com:4222"}, "natsURL", ""},
		{"one callout replica", map[string]any{"callout": map[string]any{"replicas": 1}}, "/callout/replicas", ""},
		{"an unknown NATS monitor", map[string]any{"nats": map[string]any{"monitor": "everywhere"}}, "/nats/monitor", ""},
		{"an unknown top-level value", map[string]any{"tolerations": []any{}}, "tolerations", ""},
		{"an unknown pull policy", map[string]any{"imagePullPolicy": "Sometimes"}, "/imagePullPolicy", ""},
		{"a toleration's unknown operator", map[string]any{"runner": map[string]any{"tolerations": []any{map[string]any{"operator": "Sometimes"}}}}, "/runner/tolerations/0/operator", ""},
		{"a common label the chart sets", map[string]any{"commonLabels": map[string]any{"app.kubernetes.io/name": "mine"}}, "commonLabels", ""},
		{"the token longer than the cluster allows", map[string]any{"token": map[string]any{"expirationSeconds": 7200}}, "token.expirationSeconds", ""},
		{"one namespace for both", map[string]any{"namespaces": map[string]any{"callout": "compass-runner"}}, "namespaces.callout", ""},
		{"two Servers on SQLite", map[string]any{"server": map[string]any{"enabled": true, "replicas": 2}}, "server.replicas", ""},
		{"a gateway of a single nats-server", gatewayValues(false, "eu-west", "tls://nats-gateway.eu-west.example.com:7222"), "nats.gateway.enabled: a single nats-server", ""},
		{"a gateway listing its own region", gatewayValues(true, "us-east", "tls://nats-gateway.us-east.example.com:7222"),
			`nats.gateway.remotes: entry 0 "us-east" is this region's own gateway name`, ""},
		{"a gateway URL with a password", gatewayValues(true, "eu-west", "tls://compass-gateway:gw-s3cret@nats-gateway.eu-west.example.com:7222"),
			`nats.gateway.remotes: entry 0 "eu-west": URL 1 carries credentials`, "gw-s3cret"},
		{"a gateway URL with a path, after a newline", gatewayValues(true, "eu-west", "tls://nats-gateway.eu-west.example.com:7222\n/x"),
			`nats.gateway.remotes: entry 0 "eu-west": URL 1 "tls://nats-gateway.eu-west.example.com:7222\n/x" must be tls://host:port`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := WriteValues(t, good, tc.bad)
			r := Run(t, bin, TemplateArgs(dir, files)...)
			if r.Err == nil {
				t.Errorf("helm template accepted the values")
			} else if !strings.Contains(string(r.Stderr), tc.names) {
				t.Errorf("helm template's refusal does not name %s: %s", tc.names, r.Stderr)
			}
			if len(r.Stdout) != 0 {
				t.Errorf("helm template printed %d bytes on stdout with values it refused", len(r.Stdout))
			}
			_, err := c.Render(overlay(good, tc.bad), chart.Release{Name: Release, Namespace: Namespace})
			if !errors.Is(err, chart.ErrInvalidValues) {
				t.Fatalf("chart.Render: %v, want chart.ErrInvalidValues", err)
			}
			if !strings.Contains(err.Error(), tc.names) {
				t.Errorf("chart.Render's refusal does not name %s: %v", tc.names, err)
			}
			if tc.hidden != "" && (strings.Contains(string(r.Stderr), tc.hidden) || strings.Contains(err.Error(), tc.hidden)) {
				t.Errorf("a refusal repeats the URL's credential")
			}
		})
	}
	// The good values themselves render both ways: each refusal above is the
	// bad value's doing.
	if _, err := c.Render(good, chart.Release{Name: Release, Namespace: Namespace}); err != nil {
		t.Fatalf("chart.Render of the defaults: %v", err)
	}
	if len(Template(t, bin, dir, []map[string]any{good})) == 0 {
		t.Fatal("helm template of the defaults printed nothing")
	}
}

// gatewayValues are values of region us-east's gateway, on the in-cluster
// nats-server as a cluster or as a single server, with one remote at url.
func gatewayValues(cluster bool, remote, url string) map[string]any {
	return map[string]any{"nats": map[string]any{"enabled": true, "cluster": cluster, "gateway": map[string]any{
		"enabled": true, "name": "us-east", "remotes": []any{map[string]any{"name": remote, "urls": []any{url}}},
	}}}
}

// overlay is over laid on base, as helm merges a later values file: maps
// merge, a null deletes, anything else replaces. Neither is changed.
func overlay(base, over map[string]any) map[string]any {
	out := maps.Clone(base)
	for k, v := range over {
		bm, bok := out[k].(map[string]any)
		om, ook := v.(map[string]any)
		switch {
		case v == nil:
			delete(out, k)
		case bok && ook:
			out[k] = overlay(bm, om)
		default:
			out[k] = v
		}
	}
	return out
}
