package deploy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// backupParams renders the Server on SQLite with a nightly backup.
func backupParams() Params {
	p := DefaultParams()
	p.ServerImage = "ghcr.io/compass-runner/compass-server:v0.1.0"
	p.BackupSchedule = "0 3 * * *"
	p.BackupClaim = "compass-backups"
	return p
}

// The backup CronJob: the schedule, backup --to-dir into the backup claim
// with the keep, the Server's data claim, on the Server's node, hardened
// like the Server's containers, one run at a time; with NetworkPolicies, a
// policy that lets it reach nothing and nothing reach it.
func TestRenderBackupCronJob(t *testing.T) {
	p := backupParams()
	p.NetworkPolicies = true
	objs := rendered(t, p)
	cj := only[*batchv1.CronJob](t, objs, p.CalloutNamespace, ServerBackupCronJob)
	if cj.Spec.Schedule != "0 3 * * *" || cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Fatalf("schedule %q, concurrency %q", cj.Spec.Schedule, cj.Spec.ConcurrencyPolicy)
	}
	pod := cj.Spec.JobTemplate.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if want := []string{"backup", "--to-dir", "/backup", "--keep", "7"}; !slices.Equal(c.Args, want) || c.Image != p.ServerImage {
		t.Fatalf("container %s %v, want %s %v", c.Image, c.Args, p.ServerImage, want)
	}
	checkContainerHardened(t, c)
	claims := map[string]string{}
	for _, v := range pod.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims[v.Name] = v.PersistentVolumeClaim.ClaimName
		}
	}
	if claims["data"] != "data-compass-server-0" || claims["backup"] != "compass-backups" {
		t.Fatalf("claims %v", claims)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	var dataDir string
	for _, e := range c.Env {
		if e.Name == "COMPASS_DATA_DIR" {
			dataDir = e.Value
		}
	}
	if mounts["data"] != dataDir || mounts["backup"] != "/backup" {
		t.Fatalf("mounts %v, COMPASS_DATA_DIR %q", mounts, dataDir)
	}
	aff := pod.Affinity
	if aff == nil || aff.PodAffinity == nil || len(aff.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
		aff.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector.MatchLabels["app.kubernetes.io/name"] != "compass-server" {
		t.Fatalf("affinity %+v: the pod must run on the Server's node (its claim is ReadWriteOnce)", aff)
	}
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Fatal("the backup pod mounts a ServiceAccount token it has no use for")
	}
	np := only[*networkingv1.NetworkPolicy](t, objs, p.CalloutNamespace, ServerBackupCronJob)
	if len(np.Spec.Ingress) != 0 || len(np.Spec.Egress) != 0 || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{"Ingress", "Egress"}) {
		t.Fatalf("the backup pod's NetworkPolicy allows %v / %v (%v)", np.Spec.Ingress, np.Spec.Egress, np.Spec.PolicyTypes)
	}

	// --backup-keep reaches the arguments; without a schedule nothing is rendered.
	p.BackupKeep = 30
	cj = only[*batchv1.CronJob](t, rendered(t, p), p.CalloutNamespace, ServerBackupCronJob)
	if args := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args; args[len(args)-1] != "30" {
		t.Fatalf("--backup-keep 30 rendered %v", args)
	}
	p = backupParams()
	p.BackupSchedule, p.BackupClaim = "", ""
	for _, o := range rendered(t, p) {
		if _, ok := o.(*batchv1.CronJob); ok {
			t.Fatal("a CronJob is rendered without --backup-schedule")
		}
	}
}

func TestBackupParamsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Params)
		want string
	}{
		{"PostgreSQL", func(p *Params) { p.ServerDatabaseSecret, p.DatabaseCIDR = "db", "10.0.0.0/8" }, "the backup CronJob copies the Server's SQLite database"},
		{"no Server", func(p *Params) { p.ServerImage = "" }, "the backup CronJob copies the Server's SQLite database"},
		{"not a schedule", func(p *Params) { p.BackupSchedule = "every night" }, `"every night" is not a cron schedule`},
		{"six fields", func(p *Params) { p.BackupSchedule = "0 0 3 * * *" }, `"0 0 3 * * *" is not a cron schedule`},
		{"no claim", func(p *Params) { p.BackupClaim = "" }, "backup claim: empty"},
		{"a claim that is no name", func(p *Params) { p.BackupClaim = "Backups!" }, `backup claim: "Backups!" is not a DNS-1123 subdomain`},
		{"keep over the limit", func(p *Params) { p.BackupKeep = 1001 }, "backup keep: 1001 is not from 1 to 1000 copies"},
		{"keep negative", func(p *Params) { p.BackupKeep = -1 }, "backup keep: -1 is not from 1 to 1000 copies"},
		{"a claim without a schedule", func(p *Params) { p.BackupSchedule = "" }, "backup schedule: empty, but the backup claim or keep is set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := backupParams()
			tc.edit(&p)
			_, err := Render(p)
			if !errors.Is(err, ErrInvalidParams) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render = %v, want ErrInvalidParams with %q", err, tc.want)
			}
		})
	}
	for _, ok := range []string{"@daily", "30 2 * * 0", "*/15 * * * *", "0 3 1-7 * MON"} {
		p := backupParams()
		p.BackupSchedule = ok
		if _, err := Render(p); err != nil {
			t.Errorf("schedule %q refused: %v", ok, err)
		}
	}
}
