package deploy

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const testServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"

// sqliteServerParams renders the Server on SQLite; postgresServerParams on
// PostgreSQL, with its network in the NetworkPolicies.
func sqliteServerParams() Params {
	p := DefaultParams()
	p.ServerImage = testServerImage
	return p
}

func postgresServerParams() Params {
	p := sqliteServerParams()
	p.ServerDatabaseSecret = "compass-server-database"
	p.DatabaseCIDR = "10.20.0.0/16"
	return p
}

// serverPodSpec returns the Server's pod template from whichever workload
// renders it, failing unless exactly one workload named compass-server does.
func serverPodSpec(t *testing.T, objs []runtime.Object, namespace string) corev1.PodTemplateSpec {
	t.Helper()
	var found []corev1.PodTemplateSpec
	for _, o := range objs {
		switch v := o.(type) {
		case *appsv1.Deployment:
			if v.Name == ServerName && v.Namespace == namespace {
				found = append(found, v.Spec.Template)
			}
		case *appsv1.StatefulSet:
			if v.Name == ServerName && v.Namespace == namespace {
				found = append(found, v.Spec.Template)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one Server workload %s/%s, found %d", namespace, ServerName, len(found))
	}
	return found[0]
}

func containerNamed(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func TestRender_ServerNotRenderedWithoutImage(t *testing.T) {
	for _, o := range rendered(t, DefaultParams()) {
		if m, ok := o.(interface{ GetName() string }); ok && strings.HasPrefix(m.GetName(), ServerName) {
			t.Errorf("%T %s rendered without a server image", o, m.GetName())
		}
	}
}

func TestRender_ServerSQLiteStatefulSet(t *testing.T) {
	p := sqliteServerParams()
	p.ServerStorage = "5Gi"
	objs := rendered(t, p)
	ss := only[*appsv1.StatefulSet](t, objs, p.CalloutNamespace, ServerName)
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 1 {
		t.Fatalf("replicas = %v, want exactly 1 on SQLite", ss.Spec.Replicas)
	}
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok && d.Name == ServerName {
			t.Fatal("a Server Deployment rendered on SQLite")
		}
	}
	if len(ss.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("volumeClaimTemplates = %d, want 1", len(ss.Spec.VolumeClaimTemplates))
	}
	pvc := ss.Spec.VolumeClaimTemplates[0]
	if pvc.Name != "data" || !slices.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) ||
		!pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("5Gi")) {
		t.Fatalf("volume claim = %+v, want data, ReadWriteOnce, 5Gi", pvc)
	}
	if ss.Spec.ServiceName != ServerName {
		t.Fatalf("serviceName = %q", ss.Spec.ServiceName)
	}
	spec := ss.Spec.Template.Spec
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		env := kubeletEnv(t, c, nil, map[string]string{"status.podIP": "10.1.2.3"})
		if c.Name == "callout" {
			// compass-callout beside the Server reads the same file
			// (TestRenderedTopologiesAcceptMintedTokensAtBothDoors runs it).
			if env["COMPASS_DATABASE_URL"] != "sqlite:///var/lib/compass/compass.db" {
				t.Errorf("callout: COMPASS_DATABASE_URL = %q, want the Server's file", env["COMPASS_DATABASE_URL"])
			}
		} else if env["COMPASS_DATA_DIR"] != "/var/lib/compass" {
			t.Errorf("%s: COMPASS_DATA_DIR = %q", c.Name, env["COMPASS_DATA_DIR"])
		}
		if _, ok := env["COMPASS_DATABASE_URL"]; ok && c.Name != "callout" {
			t.Errorf("%s: COMPASS_DATABASE_URL set on SQLite", c.Name)
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "data" && m.MountPath == "/var/lib/compass" && !m.ReadOnly
		}) {
			t.Errorf("%s: the data volume is not mounted writable at /var/lib/compass: %+v", c.Name, c.VolumeMounts)
		}
	}
	pdb := only[*policyv1.PodDisruptionBudget](t, objs, p.CalloutNamespace, ServerName)
	if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) || pdb.Spec.MinAvailable != nil {
		t.Fatalf("PDB = %+v, want maxUnavailable 1 (minAvailable 1 of one replica would block every drain)", pdb.Spec)
	}
	checkSelects(t, "PDB", pdb.Spec.Selector.MatchLabels, ss.Spec.Template.Labels)
}

func TestRender_ServerPostgresDeployment(t *testing.T) {
	for _, replicas := range []int{0, 3} {
		p := postgresServerParams()
		p.ServerReplicas = replicas
		want := int32(max(replicas, MinServerReplicas))
		objs := rendered(t, p)
		d := only[*appsv1.Deployment](t, objs, p.CalloutNamespace, ServerName)
		if d.Spec.Replicas == nil || *d.Spec.Replicas != want {
			t.Fatalf("replicas %d: Deployment replicas = %v, want %d", replicas, d.Spec.Replicas, want)
		}
		for _, o := range objs {
			if s, ok := o.(*appsv1.StatefulSet); ok && s.Name == ServerName {
				t.Fatal("a Server StatefulSet rendered on PostgreSQL")
			}
		}
		ru := d.Spec.Strategy.RollingUpdate
		if ru == nil || ru.MaxUnavailable == nil || *ru.MaxUnavailable != intstr.FromInt32(0) {
			t.Fatalf("rolling update = %+v, want maxUnavailable 0", ru)
		}
		spec := d.Spec.Template.Spec
		aa := spec.Affinity
		if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
			aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
			t.Fatalf("affinity = %+v, want the Servers spread over nodes", aa)
		}
		secrets := map[string]string{"compass-server-database/url": "postgres://compass@db.example:5432/compass"}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			env := kubeletEnv(t, c, secrets, map[string]string{"status.podIP": "10.1.2.3"})
			if env["COMPASS_DATABASE_URL"] != secrets["compass-server-database/url"] {
				t.Errorf("%s: COMPASS_DATABASE_URL = %q, want the Secret's url", c.Name, env["COMPASS_DATABASE_URL"])
			}
			if _, ok := env["COMPASS_DATA_DIR"]; ok {
				t.Errorf("%s: COMPASS_DATA_DIR set on PostgreSQL", c.Name)
			}
		}
		for _, v := range spec.Volumes {
			if v.PersistentVolumeClaim != nil || v.Name == "data" {
				t.Errorf("volume %s on PostgreSQL", v.Name)
			}
		}
		pdb := only[*policyv1.PodDisruptionBudget](t, objs, p.CalloutNamespace, ServerName)
		if pdb.Spec.MinAvailable == nil || *pdb.Spec.MinAvailable != intstr.FromInt32(1) {
			t.Fatalf("PDB minAvailable = %v, want 1", pdb.Spec.MinAvailable)
		}
		checkSelects(t, "PDB", pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
}

// TestRender_CalloutDatabaseSecret: with server.calloutDatabaseSecret the
// callout reads the Server's PostgreSQL database through its own Secret (a
// role granted only SELECT, docs/store.md); the Server, its init container
// and the migrate Job keep the Server's. Without it the callout reads the
// Server's.
func TestRender_CalloutDatabaseSecret(t *testing.T) {
	secrets := map[string]string{
		"compass-server-database/url":  "postgres://compass@db.example:5432/compass",
		"compass-callout-database/url": "postgres://compass_callout@db.example:5432/compass",
	}
	calloutURL := func(t *testing.T, p Params) string {
		t.Helper()
		d := only[*appsv1.Deployment](t, rendered(t, p), p.CalloutNamespace, "compass-callout")
		return kubeletEnv(t, d.Spec.Template.Spec.Containers[0], secrets, map[string]string{"status.podIP": "10.1.2.3"})["COMPASS_DATABASE_URL"]
	}
	p := postgresServerParams()
	if got := calloutURL(t, p); got != secrets["compass-server-database/url"] {
		t.Fatalf("without a callout database secret: the callout reads %q, want the Server's", got)
	}
	p.CalloutDatabaseSecret = "compass-callout-database"
	if got := calloutURL(t, p); got != secrets["compass-callout-database/url"] {
		t.Fatalf("with one: the callout reads %q, want its own", got)
	}
	objs := rendered(t, p)
	spec := only[*appsv1.Deployment](t, objs, p.CalloutNamespace, ServerName).Spec.Template.Spec
	out, err := RenderMigrateJob(p)
	if err != nil {
		t.Fatal(err)
	}
	var j batchv1.Job
	if err := yaml.UnmarshalStrict(bytes.TrimPrefix(out, []byte("\n---\n")), &j); err != nil {
		t.Fatal(err)
	}
	job := j.Spec.Template.Spec
	for _, c := range slices.Concat(spec.InitContainers, spec.Containers, job.Containers) {
		env := kubeletEnv(t, c, secrets, map[string]string{"status.podIP": "10.1.2.3"})
		if env["COMPASS_DATABASE_URL"] != secrets["compass-server-database/url"] {
			t.Errorf("%s: COMPASS_DATABASE_URL = %q, want the Server's", c.Name, env["COMPASS_DATABASE_URL"])
		}
	}
}

// TestRender_ServerMigratesFirst: one init container runs compass-server
// migrate with the Server's image and exactly its database settings.
// One migration policy (docs/store.md): the Server's pod only checks the
// schema (an init container running check-schema), and the migrate Job,
// rendered apart by --migrate-job, is the one that migrates; all three read
// the same database setting, with the same image.
func TestRender_ServerChecksTheSchemaAndTheJobMigrates(t *testing.T) {
	for name, p := range map[string]Params{"sqlite": sqliteServerParams(), "postgres": postgresServerParams()} {
		t.Run(name, func(t *testing.T) {
			objs := rendered(t, p)
			spec := serverPodSpec(t, objs, p.CalloutNamespace).Spec
			if len(spec.InitContainers) != 1 {
				t.Fatalf("init containers = %d, want 1", len(spec.InitContainers))
			}
			for _, o := range objs {
				if j, ok := o.(*batchv1.Job); ok {
					t.Fatalf("the manifests render Job %s: a migration would run on every apply", j.Name)
				}
			}
			c := spec.InitContainers[0]
			s := containerNamed(t, spec.Containers, "server")
			if c.Name != "check-schema" || c.Image != p.ServerImage || !slices.Equal(c.Args, []string{"check-schema"}) {
				t.Fatalf("init container = %s %s %v, want check-schema %s [check-schema]", c.Name, c.Image, c.Args, p.ServerImage)
			}
			if s.Image != p.ServerImage || !slices.Equal(s.Args, []string{"serve"}) {
				t.Fatalf("server container = %s %v", s.Image, s.Args)
			}
			out, err := RenderMigrateJob(p)
			if err != nil {
				t.Fatal(err)
			}
			var job batchv1.Job
			if err := yaml.UnmarshalStrict(bytes.TrimPrefix(out, []byte("\n---\n")), &job); err != nil {
				t.Fatalf("the migrate Job: %v\n%s", err, out)
			}
			if job.Name != ServerMigrateJob || job.Namespace != p.CalloutNamespace || job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 0 ||
				job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever || len(job.Spec.Template.Spec.Containers) != 1 {
				t.Fatalf("migrate Job = %s/%s %+v", job.Namespace, job.Name, job.Spec)
			}
			if job.Spec.Template.Labels["app.kubernetes.io/name"] == ServerName {
				t.Fatal("the Job's pod carries the Server's label: the door Service would send Runners to it")
			}
			m := job.Spec.Template.Spec.Containers[0]
			if m.Image != p.ServerImage || !slices.Equal(m.Args, []string{"migrate"}) {
				t.Fatalf("migrate container = %s %v", m.Image, m.Args)
			}
			dbEnv := func(c corev1.Container) []corev1.EnvVar {
				var out []corev1.EnvVar
				for _, e := range c.Env {
					if e.Name == "COMPASS_DATABASE_URL" || e.Name == "COMPASS_DATA_DIR" {
						out = append(out, e)
					}
				}
				return out
			}
			for _, x := range []corev1.Container{c, m} {
				if got, srv := dbEnv(x), dbEnv(s); len(got) != 1 || !equalEnv(got, srv) || len(x.Env) != 1 {
					t.Fatalf("%s env %+v, serve's database env %+v: want the same database setting only", x.Name, x.Env, srv)
				}
			}
			if p.ServerDatabaseSecret == "" {
				vols := job.Spec.Template.Spec.Volumes
				if len(vols) != 1 || vols[0].PersistentVolumeClaim == nil || vols[0].PersistentVolumeClaim.ClaimName != "data-"+ServerName+"-0" ||
					len(m.VolumeMounts) != 1 || m.VolumeMounts[0].MountPath != "/var/lib/compass" || m.VolumeMounts[0].ReadOnly {
					t.Fatalf("SQLite: the Job mounts %+v at %+v, want the Server's claim data-%s-0 at /var/lib/compass", vols, m.VolumeMounts, ServerName)
				}
			}
		})
	}
	p := DefaultParams()
	if _, err := RenderMigrateJob(p); !errors.Is(err, ErrInvalidParams) || !strings.Contains(err.Error(), "--server-image") {
		t.Fatalf("RenderMigrateJob without a Server = %v, want a refusal naming --server-image", err)
	}
}

func equalEnv(a, b []corev1.EnvVar) bool {
	return slices.EqualFunc(a, b, func(x, y corev1.EnvVar) bool {
		if x.Name != y.Name || x.Value != y.Value || (x.ValueFrom == nil) != (y.ValueFrom == nil) {
			return false
		}
		if x.ValueFrom == nil {
			return true
		}
		xs, ys := x.ValueFrom.SecretKeyRef, y.ValueFrom.SecretKeyRef
		return xs != nil && ys != nil && xs.Name == ys.Name && xs.Key == ys.Key && xs.Optional == nil && ys.Optional == nil
	})
}

func TestRender_ServerContainer(t *testing.T) {
	p := postgresServerParams()
	p.CABundleConfigMap = "compass-ca"
	p.ServerTLSSecret = "door-cert"
	objs := rendered(t, p)
	tmpl := serverPodSpec(t, objs, p.CalloutNamespace)
	spec := tmpl.Spec
	c := containerNamed(t, spec.Containers, "server")
	checkProbe(t, "liveness", c.LivenessProbe, "/healthz", "metrics")
	checkProbe(t, "readiness", c.ReadinessProbe, "/readyz", "metrics")
	ports := map[string]int32{}
	for _, pt := range c.Ports {
		ports[pt.Name] = pt.ContainerPort
	}
	if len(ports) != 2 || ports["door"] != 8443 || ports["metrics"] != 9090 {
		t.Fatalf("ports = %v, want door 8443 and metrics 9090", ports)
	}
	env := kubeletEnv(t, c, map[string]string{"compass-server-database/url": "postgres://db/compass"},
		map[string]string{"status.podIP": "fd00::7"})
	want := map[string]string{
		"COMPASS_LISTEN":             ":8443",
		"COMPASS_METRICS_ADDR":       "[fd00::7]:9090", // the pod IP, as the callout's
		"COMPASS_TLS_CERT":           "/etc/compass/tls/tls.crt",
		"COMPASS_TLS_KEY":            "/etc/compass/tls/tls.key",
		"COMPASS_RUNNER_CLUSTERS":    "/etc/compass/clusters/clusters.yaml",
		"COMPASS_NATS_URL":           p.NATSURL,
		"COMPASS_NATS_USER":          "compass-server",
		"COMPASS_NATS_PASSWORD_FILE": "/var/run/secrets/compass/server/nats/password",
		"COMPASS_NATS_CA_FILE":       "/etc/compass/ca/ca.crt",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "COMPASS_") {
			t.Errorf("env %s is not a COMPASS_* variable", e.Name)
		}
	}
	// Every file the env names lies under a mount of the volume that holds it.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("mount %s uses subPath, which the kubelet never updates", m.Name)
		}
	}
	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	tls := vols[mounts["tls"].Name]
	if mounts["tls"].MountPath != "/etc/compass/tls" || tls.Secret == nil || tls.Secret.SecretName != "door-cert" {
		t.Fatalf("door certificate: mount %+v volume %+v, want Secret door-cert at /etc/compass/tls", mounts["tls"], tls)
	}
	cl := vols[mounts["runner-clusters"].Name]
	if mounts["runner-clusters"].MountPath != "/etc/compass/clusters" || cl.ConfigMap == nil || cl.ConfigMap.Name != RunnerClustersConfigMap || len(cl.ConfigMap.Items) != 0 {
		t.Fatalf("cluster file: mount %+v volume %+v, want the whole ConfigMap %s at /etc/compass/clusters", mounts["runner-clusters"], cl, RunnerClustersConfigMap)
	}
	sec := vols[mounts["server-secrets"].Name]
	if mounts["server-secrets"].MountPath != "/var/run/secrets/compass/server" || sec.Projected == nil || len(sec.Projected.Sources) != 1 ||
		sec.Projected.Sources[0].Secret == nil || sec.Projected.Sources[0].Secret.Name != ServerNATSSecret ||
		sec.Projected.Sources[0].Secret.Items[0].Path != "nats/password" {
		t.Fatalf("server secrets: mount %+v volume %+v", mounts["server-secrets"], sec)
	}
	if ca := vols[mounts["ca"].Name]; ca.ConfigMap == nil || ca.ConfigMap.Name != "compass-ca" {
		t.Fatalf("CA volume = %+v", ca)
	}
	// Services: the door and, apart, the metrics, both selecting the Server.
	door := only[*corev1.Service](t, objs, p.CalloutNamespace, ServerName)
	if len(door.Spec.Ports) != 1 || door.Spec.Ports[0].Port != 8443 || door.Spec.Ports[0].TargetPort != intstr.FromString("door") {
		t.Fatalf("door Service ports = %+v", door.Spec.Ports)
	}
	checkSelects(t, "door Service", door.Spec.Selector, tmpl.Labels)
	met := only[*corev1.Service](t, objs, p.CalloutNamespace, ServerMetricsService)
	if len(met.Spec.Ports) != 1 || met.Spec.Ports[0].Port != 9090 || met.Spec.Ports[0].TargetPort != intstr.FromString("metrics") {
		t.Fatalf("metrics Service ports = %+v", met.Spec.Ports)
	}
	checkSelects(t, "metrics Service", met.Spec.Selector, tmpl.Labels)
	sa := only[*corev1.ServiceAccount](t, objs, p.CalloutNamespace, ServerName)
	if spec.ServiceAccountName != sa.Name || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Fatalf("ServiceAccount %s automount %v, pod uses %q", sa.Name, sa.AutomountServiceAccountToken, spec.ServiceAccountName)
	}
	checkNoAPIToken(t, "Server", &spec)
}

func TestRender_ServerPodHardened(t *testing.T) {
	for name, p := range map[string]Params{"sqlite": sqliteServerParams(), "postgres": postgresServerParams()} {
		t.Run(name, func(t *testing.T) {
			spec := serverPodSpec(t, rendered(t, p), p.CalloutNamespace).Spec
			psc := spec.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 ||
				psc.RunAsGroup == nil || *psc.RunAsGroup != 65532 ||
				psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Fatalf("pod securityContext = %+v, want 65532 non-root with RuntimeDefault seccomp", psc)
			}
			if spec.HostNetwork || spec.HostPID || spec.HostIPC {
				t.Fatal("the Server pod shares a host namespace")
			}
			for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
				checkContainerHardened(t, c)
			}
		})
	}
}

// checkSelects fails unless every label of selector is on the pod template.
func checkSelects(t *testing.T, what string, selector, labels map[string]string) {
	t.Helper()
	if len(selector) == 0 {
		t.Fatalf("%s selects everything", what)
	}
	for k, v := range selector {
		if labels[k] != v {
			t.Fatalf("%s selector %s=%s does not select the pods (%v)", what, k, v, labels)
		}
	}
}

func TestRender_ServerReplicasRules(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Params)
		want   string
	}{
		{"SQLite with 2", func(p *Params) { *p = sqliteServerParams(); p.ServerReplicas = 2 },
			"deploy: invalid parameters: server replicas: 2 with SQLite: the database is one file on one volume that one Server writes; for 2 or more, use PostgreSQL (a server database secret)"},
		{"PostgreSQL with 1", func(p *Params) { *p = postgresServerParams(); p.ServerReplicas = 1 },
			"deploy: invalid parameters: server replicas: 1 is outside [2, 20] on PostgreSQL"},
		{"PostgreSQL above the limit", func(p *Params) { *p = postgresServerParams(); p.ServerReplicas = MaxServerReplicas + 1 },
			"deploy: invalid parameters: server replicas: 21 is outside [2, 20] on PostgreSQL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Params
			tt.mutate(&p)
			_, err := Render(p)
			if !errors.Is(err, ErrInvalidParams) || err.Error() != tt.want {
				t.Fatalf("Render error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestManifestsCommand_ServerFlags(t *testing.T) {
	args := []string{
		"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443",
		"--server-image", testServerImage, "--server-database-secret", "db-url", "--server-replicas", "3",
		"--server-tls-secret", "door-cert", "--door-ingress-cidr", "198.51.100.0/24", "--door-ingress-cidr", "192.0.2.0/24",
		"--metrics-namespace", "observability", "--database-cidr", "10.20.0.0/16", "--database-port", "6432",
		"--issuer-cidr", "203.0.113.0/24", "--service-monitor",
	}
	p := DefaultParams()
	p.ServerImage, p.ServerDatabaseSecret, p.ServerReplicas, p.ServerTLSSecret = testServerImage, "db-url", 3, "door-cert"
	p.DoorIngressCIDRs = []string{"198.51.100.0/24", "192.0.2.0/24"}
	p.MetricsNamespace, p.DatabaseCIDR, p.DatabasePort = "observability", "10.20.0.0/16", 6432
	p.IssuerCIDRs = []string{"203.0.113.0/24"}
	p.ServiceMonitor = true
	var stdout, stderr bytes.Buffer
	if err := ManifestsCommand(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("ManifestsCommand: %v (stderr %q)", err, stderr.String())
	}
	want, err := Render(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stdout.Bytes(), want) {
		t.Fatal("ManifestsCommand differs from rendering the same parameters")
	}
	stdout.Reset()
	if err := ManifestsCommand(context.Background(), []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443", "--network-policies=false"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stdout.Bytes(), []byte("kind: NetworkPolicy")) {
		t.Fatal("--network-policies=false rendered a NetworkPolicy")
	}
	stdout.Reset()
	err = ManifestsCommand(context.Background(), []string{"--cluster-name", "prod", "--server-url", "https://compass.example.com:8443", "--server-image", testServerImage, "--server-replicas", "2"}, &stdout, &stderr)
	if !errors.Is(err, ErrInvalidParams) || !strings.HasPrefix(err.Error(), "deploy: invalid parameters: server replicas: 2 with SQLite") || stdout.Len() != 0 {
		t.Fatalf("--server-replicas 2 on SQLite: %v (stdout %d bytes)", err, stdout.Len())
	}
}
