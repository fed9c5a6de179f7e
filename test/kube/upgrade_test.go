package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/compass-runner/identity/deploy"
	"github.com/compass-runner/identity/test/helm"
)

// upgradeManager is the field manager of every apply, install and upgrade
// alike: the deployer identity is Flux's kustomize-controller, which applies
// under that name. docs/store.md ("Upgrading") asks for the same manager at
// both: a server-side apply under another one leaves the previous release's
// fields in place (TestUpgradeFromThePreviousReleaseAppliesAsTheGuideSays
// shows it on the Server's workload).
const upgradeManager = "kustomize-controller"

// sqliteLeftoverDelete is the line docs/store.md ("Upgrading") gives an
// operator upgrading a SQLite installation from v0.1.0: the objects the
// previous release rendered and this one does not, since compass-callout runs
// in the Server's pod (DL-452). Left behind, the old callout Deployment keeps
// answering NATS beside the new one on the previous release's image, without
// the Server's database (a minted token enrolls and is then refused at NATS
// by whichever replica answers), and refuses to start again once migrated.
const sqliteLeftoverDelete = "kubectl -n compass-system delete deployment/compass-callout poddisruptionbudget/compass-callout"

// releaseImages are the images one release's manifests name.
type releaseImages struct{ server, callout, runner, nats string }

var (
	// previousImages: v0.1.0's images and the nats image its guide named.
	previousImages = releaseImages{
		server:  "ghcr.io/compass-runner/compass-server:v0.1.0",
		callout: "ghcr.io/compass-runner/compass-callout:v0.1.0",
		runner:  "ghcr.io/compass-runner/compass-runner:v0.1.0",
		nats:    "nats:2.12.1-alpine",
	}
	// nextImages: the release being installed, with the nats image this
	// guide names.
	nextImages = releaseImages{
		server:  "ghcr.io/compass-runner/compass-server:v0.2.0",
		callout: "ghcr.io/compass-runner/compass-callout:v0.2.0",
		runner:  "ghcr.io/compass-runner/compass-runner:v0.2.0",
		nats:    deploy.NATSImage,
	}
)

// manifestFlags are the flags an operator renders with: the same for both
// releases but for the images, and the same for the migrate Job as for the
// manifests (docs/store.md, "Upgrading").
func manifestFlags(img releaseImages, database []string) []string {
	return append([]string{
		"--cluster-name", "live", "--server-url", "https://compass.live.example:8443",
		"--server-image", img.server, "--callout-image", img.callout, "--runner-image", img.runner,
		"--nats-image", img.nats, "--nats-cluster", "--nats-monitor", "pod",
		"--service-monitor", "--door-ingress-cidr", "198.51.100.0/24",
	}, database...)
}

// TestUpgradeFromThePreviousReleaseAppliesAsTheGuideSays installs the
// manifests the previous release's compass-server renders (v0.1.0, built from
// its commit) on a live API server, server-side applied as the deployer in the
// stream's order, and upgrades them by docs/store.md's "Upgrading" on both
// backends: the new release's migrate Job first, then its manifests, then the
// deletions the guide lists. Every apply is accepted without forcing, so no
// immutable field (a StatefulSet's selector, serviceName or claim templates, a
// Deployment's selector) changed and no other manager holds a field; what the
// previous release rendered and this one does not is exactly what the guide
// deletes; and every object is what a fresh install of the new render makes,
// managed fields included, so nothing of the previous release is left inside
// an object either (its migrate init container, the NATS configuration's
// subPath mount). There is no kubelet: the Job does not run, so the test checks
// it is created as rendered, with the Server's database setting, and that the
// Server's pods would start with check-schema only. A later release's Job is
// refused over the finished one (a Job's template is immutable) until it is
// deleted, as the guide says.
func TestUpgradeFromThePreviousReleaseAppliesAsTheGuideSays(t *testing.T) {
	assets := requireBinaries(t)
	previous := buildPreviousServer(t)
	next := buildServer(t, t.TempDir())
	guide, err := os.ReadFile(filepath.Join(helm.RepoRoot(t), "docs", "store.md"))
	if err != nil {
		t.Fatal(err)
	}
	upgrading := section(string(guide), "## Upgrading")
	if !strings.Contains(upgrading, sqliteLeftoverDelete) {
		t.Fatalf("docs/store.md's Upgrading does not say %q", sqliteLeftoverDelete)
	}
	for _, tc := range []struct {
		name     string
		database []string
		// leftovers are the kind/name of what the previous release rendered
		// and this one does not: what the guide must say to delete.
		leftovers []string
	}{
		{"PostgreSQL", []string{"--server-database-secret", "compass-server-database", "--database-cidr", "10.20.0.0/16"}, nil},
		{"SQLite", nil, strings.Fields(sqliteLeftoverDelete)[4:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			s := startUpgradeCluster(t, assets, "upgrade-"+strings.ToLower(tc.name))
			prevObjs := renderWith(t, previous, manifestFlags(previousImages, tc.database)...)
			nextFlags := manifestFlags(nextImages, tc.database)
			nextObjs := renderWith(t, next, nextFlags...)

			// The installation: the previous release, applied in the stream's order.
			for _, u := range prevObjs {
				if _, err := s.apply(ctx, u, upgradeManager, false, false); err != nil {
					t.Fatalf("previous release: %v", err)
				}
			}
			checkOtherManagerKeepsOldFields(t, s, serverWorkload(t, nextObjs))

			// Upgrading, step 2: the migrate Job, rendered by the new release
			// with the manifests' flags.
			jobs := renderWith(t, next, append(slices.Clone(nextFlags), "--migrate-job")...)
			if len(jobs) != 1 || jobs[0].GetKind() != "Job" || jobs[0].GetName() != deploy.ServerMigrateJob {
				t.Fatalf("--migrate-job rendered %s, want the Job %s alone", describe(jobs), deploy.ServerMigrateJob)
			}
			if _, err := s.apply(ctx, jobs[0], upgradeManager, false, false); err != nil {
				t.Fatalf("migrate Job: %v", err)
			}

			// Step 3: the new release's manifests, then the guide's deletions.
			for _, u := range nextObjs {
				if _, err := s.apply(ctx, u, upgradeManager, false, false); err != nil {
					t.Fatalf("new release over the previous one: %v", err)
				}
			}
			left := missingFrom(prevObjs, nextObjs)
			if !slices.Equal(left, tc.leftovers) {
				t.Fatalf("the previous release renders %v that the new one does not; the guide deletes %v", left, tc.leftovers)
			}
			for _, ref := range tc.leftovers {
				u := byRef(t, prevObjs, ref)
				if err := s.remove(ctx, u); err != nil {
					t.Fatalf("%s %s: %v", sqliteLeftoverDelete, ref, err)
				}
			}
			for _, u := range prevObjs {
				if _, err := s.get(ctx, u); !slices.Contains(tc.leftovers, ref(u)) && err != nil {
					t.Errorf("%s: %v", ref(u), err)
				} else if slices.Contains(tc.leftovers, ref(u)) && !apierrors.IsNotFound(err) {
					t.Errorf("%s is still there after the guide's deletions (err %v)", ref(u), err)
				}
			}

			upgraded := map[string]*unstructured.Unstructured{}
			for _, u := range nextObjs {
				got, err := s.get(ctx, u)
				if err != nil {
					t.Fatalf("%s after the upgrade: %v", ref(u), err)
				}
				upgraded[ref(u)] = got
				for _, d := range notIn(u.Object, got.Object, "") {
					t.Errorf("%s after the upgrade: %s", ref(u), d)
				}
				checkOneApplyManager(t, got)
			}
			job, err := s.get(ctx, jobs[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range notIn(jobs[0].Object, job.Object, "") {
				t.Errorf("Job %s: %s", job.GetName(), d)
			}
			checkSchemaGate(t, upgraded[ref(serverWorkload(t, nextObjs))], job)

			// A fresh install of the new render, object by object in the
			// stream's order (the Namespaces stay: without a namespace
			// controller a deleted Namespace never goes), must make the same
			// objects as the upgrade did.
			for _, u := range slices.Backward(nextObjs) {
				if u.GetKind() != "Namespace" {
					if err := s.remove(ctx, u); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, u := range nextObjs {
				if u.GetKind() == "Namespace" {
					continue
				}
				if _, err := s.apply(ctx, u, upgradeManager, false, false); err != nil {
					t.Fatalf("fresh install: %v", err)
				}
				fresh, err := s.get(ctx, u)
				if err != nil {
					t.Fatal(err)
				}
				if a, b := stripped(upgraded[ref(u)]), stripped(fresh); !reflect.DeepEqual(a, b) {
					t.Errorf("%s upgraded differs from a fresh install:\n upgraded %s\n fresh    %s", ref(u), compact(a), compact(b))
				}
			}

			// The next release's Job over this one's: refused, since a Job's
			// template cannot change, until the finished Job is deleted.
			later := renderWith(t, next, append(manifestFlags(releaseImages{
				server: "ghcr.io/compass-runner/compass-server:v0.3.0", callout: nextImages.callout,
				runner: nextImages.runner, nats: nextImages.nats,
			}, tc.database), "--migrate-job")...)[0]
			if _, err := s.apply(ctx, later, upgradeManager, false, false); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "field is immutable") {
				t.Fatalf("a later release's Job over this one: %v, want spec.template immutable", err)
			}
			if err := s.remove(ctx, job); err != nil {
				t.Fatalf("kubectl delete job %s: %v", job.GetName(), err)
			}
			if _, err := s.apply(ctx, later, upgradeManager, false, false); err != nil {
				t.Fatalf("a later release's Job once the guide's delete ran: %v", err)
			}
		})
	}
}

// checkOtherManagerKeepsOldFields applies the new release's Server workload,
// as a dry run, under another field manager than the installation's:
// refused as a conflict without forcing, and forced it keeps the previous
// release's migrate init container beside check-schema, still owned by the
// installation's manager. That is why the guide upgrades under the same one.
func checkOtherManagerKeepsOldFields(t *testing.T, s *upgradeCluster, u *unstructured.Unstructured) {
	t.Helper()
	ctx := t.Context()
	if _, err := s.apply(ctx, u, "kubectl", false, true); !apierrors.IsConflict(err) {
		t.Errorf("the new Server workload under another manager, not forced: %v, want a conflict", err)
	}
	got, err := s.apply(ctx, u, "kubectl", true, true)
	if err != nil {
		t.Fatalf("the new Server workload under another manager, forced: %v", err)
	}
	if names := initContainerNames(got); !slices.Equal(names, []string{"migrate", "check-schema"}) {
		t.Errorf("under another manager the Server's init containers would be %v, want the previous release's migrate left beside check-schema", names)
	}
}

// checkSchemaGate checks the Server's pod template starts with check-schema
// alone, of the new image and the Server container's database setting, and
// the migrate Job runs migrate with the same image and setting (and, on
// SQLite, the claim the StatefulSet gives its only pod).
func checkSchemaGate(t *testing.T, server, job *unstructured.Unstructured) {
	t.Helper()
	if names := initContainerNames(server); !slices.Equal(names, []string{"check-schema"}) {
		t.Errorf("the Server's init containers are %v, want check-schema alone (docs/store.md: the pod never migrates)", names)
	}
	inits, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "initContainers")
	containers, _, _ := unstructured.NestedSlice(server.Object, "spec", "template", "spec", "containers")
	jobContainers, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
	if len(inits) != 1 || len(containers) == 0 || len(jobContainers) != 1 {
		t.Fatalf("containers: %d init, %d in the Server, %d in the Job", len(inits), len(containers), len(jobContainers))
	}
	check, serve, migrate := inits[0].(map[string]any), containers[0].(map[string]any), jobContainers[0].(map[string]any)
	if check["image"] != nextImages.server || serve["image"] != nextImages.server || migrate["image"] != nextImages.server {
		t.Errorf("images: check-schema %v, server %v, migrate Job %v; want %s", check["image"], serve["image"], migrate["image"], nextImages.server)
	}
	if !reflect.DeepEqual(check["args"], []any{"check-schema"}) || !reflect.DeepEqual(migrate["args"], []any{"migrate"}) {
		t.Errorf("args: init container %v, Job %v", check["args"], migrate["args"])
	}
	db := databaseEnv(serve)
	if len(db) == 0 {
		t.Fatalf("the Server container has no database setting: %v", serve["env"])
	}
	if !reflect.DeepEqual(databaseEnv(check), db) || !reflect.DeepEqual(databaseEnv(migrate), db) {
		t.Errorf("database settings: server %v, check-schema %v, migrate Job %v", db, databaseEnv(check), databaseEnv(migrate))
	}
	if server.GetKind() != "StatefulSet" {
		return
	}
	claims, _, _ := unstructured.NestedSlice(server.Object, "spec", "volumeClaimTemplates")
	if len(claims) != 1 {
		t.Fatalf("the StatefulSet has %d claim templates, want 1", len(claims))
	}
	claimName, _, _ := unstructured.NestedString(claims[0].(map[string]any), "metadata", "name")
	want := claimName + "-" + server.GetName() + "-0"
	vols, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "volumes")
	var got []string
	for _, v := range vols {
		if c, ok, _ := unstructured.NestedString(v.(map[string]any), "persistentVolumeClaim", "claimName"); ok {
			got = append(got, c)
		}
	}
	if !slices.Equal(got, []string{want}) {
		t.Errorf("the migrate Job mounts claims %v, want the Server pod's %s", got, want)
	}
}

// databaseEnv is a container's database variables.
func databaseEnv(c map[string]any) []any {
	env, _ := c["env"].([]any)
	var out []any
	for _, e := range env {
		if n, _ := e.(map[string]any)["name"].(string); n == "COMPASS_DATABASE_URL" || n == "COMPASS_DATA_DIR" {
			out = append(out, e)
		}
	}
	return out
}

func initContainerNames(u *unstructured.Unstructured) []string {
	inits, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "initContainers")
	var names []string
	for _, c := range inits {
		n, _ := c.(map[string]any)["name"].(string)
		names = append(names, n)
	}
	return names
}

// checkOneApplyManager: the object's fields are held by the installation's
// apply alone, so no apply of a later release can meet a conflict.
func checkOneApplyManager(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	var managers []string
	for _, m := range u.GetManagedFields() {
		managers = append(managers, fmt.Sprintf("%s/%s", m.Manager, m.Operation))
	}
	if want := []string{upgradeManager + "/" + string(metav1.ManagedFieldsOperationApply)}; !slices.Equal(managers, want) {
		t.Errorf("%s is managed by %v, want %v", ref(u), managers, want)
	}
}

// serverWorkload is the Server's Deployment or StatefulSet among objs.
func serverWorkload(t *testing.T, objs []*unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	for _, u := range objs {
		if (u.GetKind() == "Deployment" || u.GetKind() == "StatefulSet") && u.GetName() == deploy.ServerName {
			return u
		}
	}
	t.Fatalf("no Server workload in %s", describe(objs))
	return nil
}

// ref names an object as kubectl does: kind/name, the kind lowercased.
func ref(u *unstructured.Unstructured) string {
	return strings.ToLower(u.GetKind()) + "/" + u.GetName()
}

func byRef(t *testing.T, objs []*unstructured.Unstructured, r string) *unstructured.Unstructured {
	t.Helper()
	for _, u := range objs {
		if ref(u) == r {
			return u
		}
	}
	t.Fatalf("%s is not in the previous release's manifests", r)
	return nil
}

// missingFrom lists, in stream order, what was rendered in from and is not in
// to (by kind, namespace and name).
func missingFrom(from, to []*unstructured.Unstructured) []string {
	key := func(u *unstructured.Unstructured) string {
		return u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
	}
	have := map[string]bool{}
	for _, u := range to {
		have[key(u)] = true
	}
	var out []string
	for _, u := range from {
		if !have[key(u)] {
			out = append(out, ref(u))
		}
	}
	return out
}

func describe(objs []*unstructured.Unstructured) string {
	var refs []string
	for _, u := range objs {
		refs = append(refs, ref(u))
	}
	return "[" + strings.Join(refs, " ") + "]"
}

// section is the text of a Markdown section from its heading to the next
// heading of the same level.
func section(doc, heading string) string {
	_, rest, ok := strings.Cut(doc, "\n"+heading+"\n")
	if !ok {
		return ""
	}
	level := heading[:strings.IndexByte(heading, ' ')+1]
	if i := strings.Index(rest, "\n"+level); i >= 0 {
		return rest[:i]
	}
	return rest
}

// notIn lists where want (a rendered object) is not contained in got (the
// stored one): every field rendered is stored with the same value; the API
// server may add defaults. Numbers are compared as JSON writes them.
func notIn(want, got any, path string) []string {
	want, got = jsonValue(want), jsonValue(got)
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: stored %v, rendered an object", path, got)}
		}
		var out []string
		for k, v := range w {
			gv, ok := g[k]
			if !ok {
				out = append(out, fmt.Sprintf("%s.%s: rendered, not stored", path, k))
				continue
			}
			out = append(out, notIn(v, gv, path+"."+k)...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: stored %s, rendered %s", path, compact(got), compact(want))}
		}
		var out []string
		for i := range w {
			out = append(out, notIn(w[i], g[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	default:
		if !reflect.DeepEqual(want, got) {
			return []string{fmt.Sprintf("%s: stored %v, rendered %v", path, got, want)}
		}
		return nil
	}
}

// jsonValue is v as encoding/json decodes it with numbers kept as written,
// so that a rendered 2 (a float64 from YAML) equals a stored 2 (an int64).
func jsonValue(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		return v
	}
	return out
}

// stripped is an object without what the API server sets per object and
// per write: identity, versions, times, status, a Service's allocated
// addresses, the DaemonSet's template generation; managed fields keep who
// owns which fields and drop when.
func stripped(u *unstructured.Unstructured) any {
	c := u.DeepCopy()
	for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "generation"} {
		unstructured.RemoveNestedField(c.Object, "metadata", f)
	}
	unstructured.RemoveNestedField(c.Object, "status")
	unstructured.RemoveNestedField(c.Object, "spec", "clusterIP")
	unstructured.RemoveNestedField(c.Object, "spec", "clusterIPs")
	if a := c.GetAnnotations(); a != nil {
		delete(a, "deprecated.daemonset.template.generation")
		if len(a) == 0 {
			a = nil
		}
		c.SetAnnotations(a)
	}
	mf := c.GetManagedFields()
	for i := range mf {
		mf[i].Time = nil
	}
	c.SetManagedFields(mf)
	return jsonValue(c.Object)
}

func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// upgradeCluster is a control plane of its own for one upgrade: the Runner
// manifests and the Server share names across both backends, so each backend
// gets a cluster, with the deployer bound and the Prometheus Operator's
// monitor CRDs served.
type upgradeCluster struct {
	*apiServer
	mapper   meta.RESTMapper
	deployer dynamic.Interface // as the deployer
	admin    dynamic.Interface
}

func startUpgradeCluster(t *testing.T, assets, name string) *upgradeCluster {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	key, err := newRSAKey(dir, name+"-sa")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startAPIServer(ctx, assets, serverSpec{name: name, signing: key}, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.stop(); err != nil {
			t.Error(err)
		}
	})
	if err := srv.bindDeployer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.installMonitorCRDs(ctx); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(srv.admin)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	c := &upgradeCluster{apiServer: srv, mapper: restmapper.NewDiscoveryRESTMapper(groups)}
	if c.deployer, err = dynamic.NewForConfig(srv.asConfig(deployerUser, "system:serviceaccounts", "system:serviceaccounts:flux-system", "system:authenticated")); err != nil {
		t.Fatal(err)
	}
	if c.admin, err = dynamic.NewForConfig(srv.admin); err != nil {
		t.Fatal(err)
	}
	return c
}

// resource is the client for u's kind and namespace, through dyn.
func (c *upgradeCluster) resource(dyn dynamic.Interface, u *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("test/kube: %s: %w", ref(u), err)
	}
	if ns := u.GetNamespace(); ns != "" {
		return dyn.Resource(m.Resource).Namespace(ns), nil
	}
	return dyn.Resource(m.Resource), nil
}

// apply server-side applies u as the deployer under manager, as
// kubectl apply --server-side (or Flux) does: force only when asked.
func (c *upgradeCluster) apply(ctx context.Context, u *unstructured.Unstructured, manager string, force, dryRun bool) (*unstructured.Unstructured, error) {
	ri, err := c.resource(c.deployer, u)
	if err != nil {
		return nil, err
	}
	opts := metav1.ApplyOptions{FieldManager: manager, Force: force}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	got, err := ri.Apply(ctx, u.GetName(), u, opts)
	if err != nil {
		return nil, fmt.Errorf("test/kube: apply %s: %w", ref(u), err)
	}
	return got, nil
}

func (c *upgradeCluster) get(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	ri, err := c.resource(c.admin, u)
	if err != nil {
		return nil, err
	}
	return ri.Get(ctx, u.GetName(), metav1.GetOptions{})
}

// remove deletes u as kubectl delete does (dependents in the background)
// and waits until it is gone.
func (c *upgradeCluster) remove(ctx context.Context, u *unstructured.Unstructured) error {
	ri, err := c.resource(c.deployer, u)
	if err != nil {
		return err
	}
	bg := metav1.DeletePropagationBackground
	if err := ri.Delete(ctx, u.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		return fmt.Errorf("test/kube: delete %s: %w", ref(u), err)
	}
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := c.get(ctx, u)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return fmt.Errorf("test/kube: %s never went: %w", ref(u), err)
	}
	return nil
}
