package deploy

import (
	"encoding/json"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/deploy/chart"
)

// manifests prints every template of the chart but the migrate Job, which
// --migrate-job prints alone: a template added to the chart and not to
// manifestOrder would be installed by Helm and left out by manifests.
func TestManifestOrderNamesEveryTemplate(t *testing.T) {
	c, err := loadChart()
	if err != nil {
		t.Fatal(err)
	}
	p := DefaultParams()
	out, err := c.Render(p.Values(), release)
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(maps.Keys(out))
	want := slices.Sorted(slices.Values(append(slices.Clone(manifestOrder), "server-migrate-job.yaml")))
	if !slices.Equal(got, want) {
		t.Fatalf("the chart's templates are %v; manifestOrder and the migrate Job name %v", got, want)
	}
	for _, name := range got {
		if path.Ext(name) != ".yaml" {
			t.Fatalf("template %s: not .yaml", name)
		}
	}
}

// The chart's view (templates/_view.tpl) spells the fixed names, paths and
// settings again, in template language: each is compared with the deploy
// package's constant the tests and the docs name.
func TestViewConstantsAreTheDeployPackages(t *testing.T) {
	c, err := loadChart()
	if err != nil {
		t.Fatal(err)
	}
	// A cluster, so the route names are in the view: one the chart renders
	// only with the in-cluster nats-server.
	p := DefaultParams()
	p.NATSImage, p.NATSCluster = NATSImage, true
	raw, err := c.Include(p.Values(), release, "compass.viewJSON")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		PolicyName, ContainmentPolicyName                        string
		ServiceAccount, DaemonSet, Audience, TokenDir, TokenPath string
		NATSCalloutIssuer, NATSCalloutXKey                       string
		AuthTimeoutSeconds                                       int
		Names                                                    natsNames
		Server                                                   serverNames
		NATS                                                     struct {
			ConfigDir, RunDir, PIDFile, LameDuckDuration, LameDuckGrace string
			TerminationGraceSeconds, ReloadEverySeconds                 int
		}
		NATSHelmImage           struct{ Repository, Tag string }
		MonitorJobLabel         string
		PrometheusRuleName      string
		DashboardConfigMap      string
		DashboardKey            string
		BackupKeepCopies        int
		TokenExpirationSeconds  int64
		MaxTokenLifetimeSeconds int64
	}
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("compass.viewJSON: %v\n%s", err, raw)
	}
	check := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("the view's %s = %v, the deploy package's %v", what, got, want)
		}
	}
	check("PolicyName", v.PolicyName, PolicyName)
	check("ContainmentPolicyName", v.ContainmentPolicyName, ContainmentPolicyName)
	check("ServiceAccount", v.ServiceAccount, RunnerServiceAccount)
	check("DaemonSet", v.DaemonSet, RunnerDaemonSet)
	check("Audience", v.Audience, TokenAudience)
	check("TokenDir", v.TokenDir, TokenDir)
	check("TokenPath", v.TokenPath, TokenPath)
	check("NATSCalloutIssuer placeholder", v.NATSCalloutIssuer, PlaceholderIssuer)
	check("NATSCalloutXKey placeholder", v.NATSCalloutXKey, PlaceholderXKey)
	check("AuthTimeoutSeconds", v.AuthTimeoutSeconds, authTimeoutSeconds)
	check("Names", v.Names, natsNames{
		UsersSecret: NATSUsersSecret, RouteSecret: NATSRouteSecret, RouteUser: NATSRouteUser,
		TLSDir: natsTLSDir, RouteTLSDir: natsRouteTLSDir,
		RoutePasswordEnv: natsRoutePasswordEnv, RouteURLsEnv: natsRouteURLsEnv,
		ServerNameEnv: natsServerNameEnv, PodIPEnv: podIPEnv, Headless: natsHeadlessService,
		ClientPort: 4222, RoutePort: 6222, MonitorPort: 8222,
		GatewaySecret: NATSGatewaySecret, GatewayUser: NATSGatewayUser, GatewayTLSDir: natsGatewayTLSDir,
		GatewayPasswordEnv: natsGatewayPasswordEnv, PodNameEnv: natsPodNameEnv, GatewayService: natsGatewayService,
	})
	check("Server", v.Server, serverNames{
		Name: ServerName, MetricsService: ServerMetricsService, NATSSecret: ServerNATSSecret,
		ClustersConfigMap: RunnerClustersConfigMap, MigrateJob: ServerMigrateJob, BackupCronJob: ServerBackupCronJob,
		BackupDir: "/backup", DataDir: "/var/lib/compass", TLSDir: "/etc/compass/tls",
		SecretsDir: "/var/run/secrets/compass/server", ClustersDir: "/etc/compass/clusters",
		DoorPort: 8443, MetricsPort: 9090, IssuerPort: 443,
	})
	check("NATS.ConfigDir", v.NATS.ConfigDir, natsConfigDir)
	check("NATS.RunDir", v.NATS.RunDir, natsRunDir)
	check("NATS.PIDFile", v.NATS.PIDFile, natsRunDir+"/nats.pid")
	check("NATS.LameDuckDuration", v.NATS.LameDuckDuration, natsLameDuckDuration.String())
	check("NATS.LameDuckGrace", v.NATS.LameDuckGrace, natsLameDuckGrace.String())
	check("NATS.TerminationGraceSeconds", v.NATS.TerminationGraceSeconds, int(natsTerminationGrace/time.Second))
	check("NATS.ReloadEverySeconds", v.NATS.ReloadEverySeconds, int(natsReloadEvery/time.Second))
	check("NATSHelmImage", v.NATSHelmImage.Repository+":"+v.NATSHelmImage.Tag, NATSImage)
	check("MonitorJobLabel", v.MonitorJobLabel, MonitorJobLabel)
	check("PrometheusRuleName", v.PrometheusRuleName, PrometheusRuleName)
	check("DashboardConfigMap", v.DashboardConfigMap, DashboardConfigMap)
	check("DashboardKey", v.DashboardKey, DashboardKey)
	check("BackupKeepCopies", v.BackupKeepCopies, DefaultBackupKeep)
	check("TokenExpirationSeconds", v.TokenExpirationSeconds, int64(p.TokenExpiration/time.Second))
	check("MaxTokenLifetimeSeconds", v.MaxTokenLifetimeSeconds, int64(p.MaxTokenLifetime/time.Second))
	// The chart's default nats image (values.yaml) is the tested one too.
	c2, err := chart.Load()
	if err != nil {
		t.Fatal(err)
	}
	vals, err := c2.Values(map[string]any{"clusterName": "prod", "serverURL": "https://compass.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	img := vals["nats"].(map[string]any)["image"].(map[string]any)
	check("values.yaml nats.image", img["repository"].(string)+":"+img["tag"].(string), NATSImage)
	if !strings.HasPrefix(NATSImage, "nats:") {
		t.Fatalf("NATSImage %s", NATSImage)
	}
}

// serverNames are the Server's fixed names, paths and ports.
type serverNames struct {
	Name, MetricsService, NATSSecret, ClustersConfigMap string
	MigrateJob, BackupCronJob, BackupDir                string
	DataDir, TLSDir, SecretsDir, ClustersDir            string
	DoorPort, MetricsPort, IssuerPort                   int
}

// natsNames are the fixed names and paths the templates share.
type natsNames struct {
	UsersSecret, RouteSecret, RouteUser string
	TLSDir, RouteTLSDir                 string
	RoutePasswordEnv, RouteURLsEnv      string
	ServerNameEnv, PodIPEnv             string
	Headless                            string
	ClientPort, RoutePort, MonitorPort  int
	GatewaySecret, GatewayUser          string
	GatewayTLSDir, GatewayPasswordEnv   string
	PodNameEnv, GatewayService          string
}
