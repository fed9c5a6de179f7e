package deploy

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// peer is one end of a connection as a NetworkPolicy sees it: a pod (its
// namespace and labels) or an address outside the cluster.
type peer struct {
	namespace string
	labels    map[string]string
	ip        netip.Addr // valid: an address outside the cluster
}

func podPeer(namespace, name string) peer {
	return peer{namespace: namespace, labels: map[string]string{"app.kubernetes.io/name": name}}
}

func external(ip string) peer { return peer{ip: netip.MustParseAddr(ip)} }

// matches is the NetworkPolicy peer semantics of networking.k8s.io/v1: a
// podSelector alone selects pods of the policy's namespace, a
// namespaceSelector alone every pod of the namespaces it selects (a
// namespace's kubernetes.io/metadata.name label is its name), both together
// the pods of those namespaces; an ipBlock matches addresses outside the
// cluster in its CIDR.
func (p peer) matches(t *testing.T, policyNS string, np networkingv1.NetworkPolicyPeer) bool {
	t.Helper()
	sel := func(s *metav1.LabelSelector, l map[string]string) bool {
		ls, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatalf("selector %+v: %v", s, err)
		}
		return ls.Matches(labels.Set(l))
	}
	switch {
	case np.IPBlock != nil:
		pfx := netip.MustParsePrefix(np.IPBlock.CIDR)
		if !p.ip.IsValid() || !pfx.Contains(p.ip) {
			return false
		}
		for _, ex := range np.IPBlock.Except {
			if netip.MustParsePrefix(ex).Contains(p.ip) {
				return false
			}
		}
		return true
	case p.ip.IsValid():
		return false
	case np.NamespaceSelector != nil:
		if !sel(np.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": p.namespace}) {
			return false
		}
		return np.PodSelector == nil || sel(np.PodSelector, p.labels)
	case np.PodSelector != nil:
		return p.namespace == policyNS && sel(np.PodSelector, p.labels)
	}
	t.Fatalf("empty peer %+v", np)
	return false
}

func portAllowed(ports []networkingv1.NetworkPolicyPort, port int, proto corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		p := corev1.ProtocolTCP
		if pp.Protocol != nil {
			p = *pp.Protocol
		}
		if p == proto && (pp.Port == nil || pp.Port.IntValue() == port) {
			return true
		}
	}
	return false
}

// admits says whether the policies that select the pod of namespace ns
// with name allow a connection: ingress from other, or egress to it, on
// port/proto. A pod no policy selects is not isolated.
func admits(t *testing.T, objs []runtime.Object, ns, name string, ingress bool, other peer, port int, proto corev1.Protocol) bool {
	t.Helper()
	self := podPeer(ns, name)
	isolated := false
	for _, o := range objs {
		np, ok := o.(*networkingv1.NetworkPolicy)
		if !ok || np.Namespace != ns {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(self.labels)) {
			continue
		}
		want := networkingv1.PolicyTypeEgress
		if ingress {
			want = networkingv1.PolicyTypeIngress
		}
		has := false
		for _, pt := range np.Spec.PolicyTypes {
			has = has || pt == want
		}
		if !has {
			continue
		}
		isolated = true
		if ingress {
			for _, r := range np.Spec.Ingress {
				if portAllowed(r.Ports, port, proto) && peersAllow(t, ns, r.From, other) {
					return true
				}
			}
		} else {
			for _, r := range np.Spec.Egress {
				if portAllowed(r.Ports, port, proto) && peersAllow(t, ns, r.To, other) {
					return true
				}
			}
		}
	}
	return !isolated
}

func peersAllow(t *testing.T, ns string, peers []networkingv1.NetworkPolicyPeer, other peer) bool {
	t.Helper()
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if other.matches(t, ns, p) {
			return true
		}
	}
	return false
}

type flow struct {
	name    string
	target  string // the pod the policy selects (in the callout namespace)
	ingress bool
	other   peer
	port    int
	proto   corev1.Protocol
	want    bool
}

func checkFlows(t *testing.T, objs []runtime.Object, ns string, flows []flow) {
	t.Helper()
	for _, f := range flows {
		dir := "egress to"
		if f.ingress {
			dir = "ingress from"
		}
		if got := admits(t, objs, ns, f.target, f.ingress, f.other, f.port, f.proto); got != f.want {
			t.Errorf("%s: %s %s %+v port %d/%s: allowed = %v, want %v", f.name, f.target, dir, f.other, f.port, f.proto, got, f.want)
		}
	}
}

const tcp, udp = corev1.ProtocolTCP, corev1.ProtocolUDP

func TestRender_NetworkPolicies(t *testing.T) {
	p := postgresServerParams()
	p.NATSImage = "nats:2.12.1-alpine"
	p.NATSCluster = true
	p.NATSMonitor = NATSMonitorPod
	objs := rendered(t, p)
	ns := p.CalloutNamespace
	runnerPod := podPeer(p.Namespace, RunnerDaemonSet)
	monitoring := podPeer("monitoring", "prometheus")
	elsewhere := podPeer("default", "attacker")
	internet := external("203.0.113.7")
	db := external("10.20.3.4")
	otherDB := external("10.30.0.1")
	dns := podPeer("kube-system", "coredns")
	var flows []flow
	for _, c := range []string{ServerName, "compass-callout"} {
		flows = append(flows,
			flow{"metrics from monitoring", c, true, monitoring, 9090, tcp, true},
			flow{"metrics from another namespace", c, true, elsewhere, 9090, tcp, false},
			flow{"metrics from a Runner", c, true, runnerPod, 9090, tcp, false},
			flow{"DNS over UDP", c, false, dns, 53, udp, true},
			flow{"DNS over TCP", c, false, dns, 53, tcp, true},
			flow{"DNS to another namespace", c, false, elsewhere, 53, udp, false},
			flow{"NATS", c, false, podPeer(ns, "nats"), 4222, tcp, true},
			flow{"NATS port elsewhere", c, false, elsewhere, 4222, tcp, false},
			flow{"PostgreSQL", c, false, db, 5432, tcp, true},
			flow{"PostgreSQL outside its network", c, false, otherDB, 5432, tcp, false},
			flow{"an issuer", c, false, internet, 443, tcp, true},
			flow{"plain HTTP", c, false, internet, 80, tcp, false},
			flow{"the route port", c, false, podPeer(ns, "nats"), 6222, tcp, false},
		)
	}
	flows = append(flows,
		flow{"the door from the internet", ServerName, true, internet, 8443, tcp, true},
		flow{"the door from a Runner", ServerName, true, runnerPod, 8443, tcp, true},
		flow{"another port from the internet", ServerName, true, internet, 9443, tcp, false},
		flow{"the callout has no door", "compass-callout", true, internet, 8443, tcp, false},
		flow{"NATS clients: a Runner", "nats", true, runnerPod, 4222, tcp, true},
		flow{"NATS clients: the callout", "nats", true, podPeer(ns, "compass-callout"), 4222, tcp, true},
		flow{"NATS clients: the Server", "nats", true, podPeer(ns, ServerName), 4222, tcp, true},
		flow{"NATS clients: another namespace", "nats", true, elsewhere, 4222, tcp, false},
		flow{"NATS clients: a pod named compass-callout elsewhere", "nats", true, podPeer("default", "compass-callout"), 4222, tcp, false},
		flow{"NATS clients: the internet", "nats", true, internet, 4222, tcp, false},
		flow{"NATS routes between servers", "nats", true, podPeer(ns, "nats"), 6222, tcp, true},
		flow{"NATS routes from the callout", "nats", true, podPeer(ns, "compass-callout"), 6222, tcp, false},
		flow{"NATS routes out", "nats", false, podPeer(ns, "nats"), 6222, tcp, true},
		flow{"NATS monitoring from monitoring", "nats", true, monitoring, 8222, tcp, true},
		flow{"NATS monitoring from a Runner", "nats", true, runnerPod, 8222, tcp, false},
		flow{"NATS resolves its peers", "nats", false, dns, 53, udp, true},
		flow{"NATS to the internet", "nats", false, internet, 443, tcp, false},
		flow{"NATS to the callout", "nats", false, podPeer(ns, "compass-callout"), 9090, tcp, false},
	)
	checkFlows(t, objs, ns, flows)
}

func TestRender_NetworkPoliciesFollowParams(t *testing.T) {
	t.Run("door CIDRs", func(t *testing.T) {
		p := sqliteServerParams()
		p.DoorIngressCIDRs = []string{"198.51.100.0/24"}
		objs := rendered(t, p)
		checkFlows(t, objs, p.CalloutNamespace, []flow{
			{"inside the CIDR", ServerName, true, external("198.51.100.9"), 8443, tcp, true},
			{"outside the CIDR", ServerName, true, external("203.0.113.7"), 8443, tcp, false},
			{"a Runner pod, always", ServerName, true, podPeer(p.Namespace, RunnerDaemonSet), 8443, tcp, true},
			{"no database on SQLite", ServerName, false, external("10.20.3.4"), 5432, tcp, false},
		})
	})
	t.Run("issuer CIDRs and the metrics namespace", func(t *testing.T) {
		p := sqliteServerParams()
		p.IssuerCIDRs = []string{"192.0.2.0/24"}
		p.MetricsNamespace = "observability"
		objs := rendered(t, p)
		checkFlows(t, objs, p.CalloutNamespace, []flow{
			{"a listed issuer", "compass-callout", false, external("192.0.2.10"), 443, tcp, true},
			{"an unlisted issuer", "compass-callout", false, external("203.0.113.7"), 443, tcp, false},
			{"the named metrics namespace", ServerName, true, podPeer("observability", "prometheus"), 9090, tcp, true},
			{"monitoring is no longer it", ServerName, true, podPeer("monitoring", "prometheus"), 9090, tcp, false},
		})
	})
	t.Run("NATS outside the rendering", func(t *testing.T) {
		p := customParams(t) // tls://nats-a.example:4222,tls://nats-b.example:4222
		p.NATSURL = "tls://nats-a.example:4222,tls://nats-b.example:7422"
		objs := rendered(t, p)
		checkFlows(t, objs, p.CalloutNamespace, []flow{
			{"the first URL's port", "compass-callout", false, external("203.0.113.7"), 4222, tcp, true},
			{"the second URL's port", "compass-callout", false, external("203.0.113.8"), 7422, tcp, true},
			{"another port", "compass-callout", false, external("203.0.113.7"), 4223, tcp, false},
		})
		for _, o := range objs {
			if np, ok := o.(*networkingv1.NetworkPolicy); ok && np.Name == "nats" {
				t.Fatal("a nats NetworkPolicy rendered without a NATS image")
			}
		}
	})
	t.Run("single NATS server: no route port", func(t *testing.T) {
		p := DefaultParams()
		p.NATSImage = "nats:2.12.1-alpine"
		objs := rendered(t, p)
		checkFlows(t, objs, p.CalloutNamespace, []flow{
			{"routes", "nats", true, podPeer(p.CalloutNamespace, "nats"), 6222, tcp, false},
			{"monitoring on loopback only", "nats", true, podPeer("monitoring", "prometheus"), 8222, tcp, false},
			{"clients", "nats", true, podPeer(p.Namespace, RunnerDaemonSet), 4222, tcp, true},
		})
	})
	t.Run("off", func(t *testing.T) {
		p := postgresServerParams()
		p.NATSImage = "nats:2.12.1-alpine"
		p.NetworkPolicies = false
		p.DatabaseCIDR = ""
		for _, o := range rendered(t, p) {
			if _, ok := o.(*networkingv1.NetworkPolicy); ok {
				t.Fatalf("NetworkPolicy rendered with NetworkPolicies off")
			}
		}
	})
}

// TestRender_EveryNetworkPolicyIsolatesBothWays: a policy that listed only
// Ingress would leave its pods' egress open.
func TestRender_EveryNetworkPolicyIsolatesBothWays(t *testing.T) {
	p := postgresServerParams()
	p.NATSImage = "nats:2.12.1-alpine"
	n := 0
	for _, o := range rendered(t, p) {
		np, ok := o.(*networkingv1.NetworkPolicy)
		if !ok {
			continue
		}
		n++
		if len(np.Spec.PolicyTypes) != 2 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress || np.Spec.PolicyTypes[1] != networkingv1.PolicyTypeEgress {
			t.Errorf("%s: policyTypes = %v, want [Ingress Egress]", np.Name, np.Spec.PolicyTypes)
		}
		if len(np.Spec.PodSelector.MatchLabels) == 0 && !isDefaultDeny(np.Name) {
			t.Errorf("%s selects every pod of the namespace", np.Name)
		}
		if isDefaultDeny(np.Name) && (len(np.Spec.PodSelector.MatchLabels) != 0 || len(np.Spec.PodSelector.MatchExpressions) != 0 || len(np.Spec.Ingress) != 0 || len(np.Spec.Egress) != 0) {
			t.Errorf("%s/%s selects %v and allows %v, %v: want every pod, nothing allowed", np.Namespace, np.Name, np.Spec.PodSelector, np.Spec.Ingress, np.Spec.Egress)
		}
	}
	if n != 7 {
		t.Fatalf("%d NetworkPolicies, want 7 (Server, callout, nats, Runner, migrate Job, a default deny in each namespace)", n)
	}
}

// isDefaultDeny names the two policies that select every pod of their
// namespace and allow nothing.
func isDefaultDeny(name string) bool {
	return name == "compass-default-deny" || name == "compass-runner-default-deny"
}

// TestRender_NetworkPoliciesRunnerAndDefaultDeny: the Runner reaches only
// DNS, the door and NATS, and only Prometheus reaches it; any other pod of
// either namespace is cut off both ways; the migrate Job reaches only DNS
// and the database.
func TestRender_NetworkPoliciesRunnerAndDefaultDeny(t *testing.T) {
	monitoring := podPeer("monitoring", "prometheus")
	elsewhere := podPeer("default", "attacker")
	internet := external("203.0.113.7")
	dns := podPeer("kube-system", "coredns")
	db := external("10.20.3.4")

	t.Run("in-cluster Server and NATS", func(t *testing.T) {
		p := postgresServerParams() // door https://compass.example.com:8443
		p.NATSImage = "nats:2.12.1-alpine"
		objs := rendered(t, p)
		rns, cns := p.Namespace, p.CalloutNamespace
		checkFlows(t, objs, rns, []flow{
			{"metrics from monitoring", RunnerDaemonSet, true, monitoring, 8081, tcp, true},
			{"metrics from elsewhere", RunnerDaemonSet, true, elsewhere, 8081, tcp, false},
			{"metrics from the internet", RunnerDaemonSet, true, internet, 8081, tcp, false},
			{"another port from monitoring", RunnerDaemonSet, true, monitoring, 9090, tcp, false},
			{"DNS", RunnerDaemonSet, false, dns, 53, udp, true},
			{"the door's URL port", RunnerDaemonSet, false, internet, 8443, tcp, true},
			{"the Server's door behind its Service", RunnerDaemonSet, false, podPeer(cns, ServerName), 8443, tcp, true},
			{"https elsewhere", RunnerDaemonSet, false, internet, 443, tcp, false},
			{"NATS in the cluster", RunnerDaemonSet, false, podPeer(cns, "nats"), 4222, tcp, true},
			{"a NATS port outside the cluster", RunnerDaemonSet, false, internet, 4222, tcp, false},
			{"a pod named nats elsewhere", RunnerDaemonSet, false, podPeer("default", "nats"), 4222, tcp, false},
			{"the callout's metrics", RunnerDaemonSet, false, podPeer(cns, "compass-callout"), 9090, tcp, false},
			{"plain HTTP", RunnerDaemonSet, false, internet, 80, tcp, false},
			{"another pod of the Runner namespace, in", "debug", true, monitoring, 8081, tcp, false},
			{"another pod of the Runner namespace, out", "debug", false, dns, 53, udp, false},
		})
		checkFlows(t, objs, cns, []flow{
			{"another pod of the callout namespace, in", "tool", true, podPeer(cns, "nats"), 8080, tcp, false},
			{"another pod of the callout namespace, out to NATS", "tool", false, podPeer(cns, "nats"), 4222, tcp, false},
			{"another pod of the callout namespace, out to DNS", "tool", false, dns, 53, udp, false},
			{"migrate Job: DNS", ServerMigrateJob, false, dns, 53, udp, true},
			{"migrate Job: PostgreSQL", ServerMigrateJob, false, db, 5432, tcp, true},
			{"migrate Job: an issuer", ServerMigrateJob, false, internet, 443, tcp, false},
			{"migrate Job: NATS", ServerMigrateJob, false, podPeer(cns, "nats"), 4222, tcp, false},
			{"migrate Job: nothing comes in", ServerMigrateJob, true, podPeer(cns, ServerName), 8443, tcp, false},
		})
	})
	t.Run("external Server and NATS", func(t *testing.T) {
		p := customParams(t) // door https://compass.internal.example:9443/door, NATS tls://...:4222
		p.NATSURL = "tls://nats-a.example:4222,tls://nats-b.example:7422"
		objs := rendered(t, p)
		checkFlows(t, objs, p.Namespace, []flow{
			{"the door's URL port", RunnerDaemonSet, false, internet, 9443, tcp, true},
			{"the default door port", RunnerDaemonSet, false, internet, 8443, tcp, false},
			{"the first NATS URL's port", RunnerDaemonSet, false, internet, 4222, tcp, true},
			{"the second NATS URL's port", RunnerDaemonSet, false, internet, 7422, tcp, true},
			{"another port", RunnerDaemonSet, false, internet, 4223, tcp, false},
		})
	})
	t.Run("NATS and door CIDRs", func(t *testing.T) {
		p := customParams(t) // door https://compass.internal.example:9443/door, NATS tls://...:4222
		p.NATSCIDRs = []string{"198.51.100.0/24"}
		p.DoorEgressCIDRs = []string{"192.0.2.0/28", "2001:db8::/32"}
		objs := rendered(t, p)
		checkFlows(t, objs, p.Namespace, []flow{
			{"the door inside its CIDR", RunnerDaemonSet, false, external("192.0.2.5"), 9443, tcp, true},
			{"the door's IPv6 CIDR", RunnerDaemonSet, false, external("2001:db8::7"), 9443, tcp, true},
			{"the door's port elsewhere", RunnerDaemonSet, false, external("203.0.113.7"), 9443, tcp, false},
			{"NATS inside its CIDR", RunnerDaemonSet, false, external("198.51.100.9"), 4222, tcp, true},
			{"NATS's port elsewhere", RunnerDaemonSet, false, external("203.0.113.7"), 4222, tcp, false},
		})
		checkFlows(t, objs, p.CalloutNamespace, []flow{
			{"the callout to NATS inside its CIDR", "compass-callout", false, external("198.51.100.9"), 4222, tcp, true},
			{"the callout to NATS's port elsewhere", "compass-callout", false, external("203.0.113.7"), 4222, tcp, false},
		})
	})
	t.Run("a door URL without a port", func(t *testing.T) {
		p := DefaultParams()
		p.ServerURL = "https://compass.example.com/door"
		checkFlows(t, rendered(t, p), p.Namespace, []flow{
			{"https", RunnerDaemonSet, false, internet, 443, tcp, true},
			{"8443", RunnerDaemonSet, false, internet, 8443, tcp, false},
		})
	})
	t.Run("SQLite: the migrate Job connects to nothing", func(t *testing.T) {
		p := sqliteServerParams()
		objs := rendered(t, p)
		checkFlows(t, objs, p.CalloutNamespace, []flow{
			{"DNS", ServerMigrateJob, false, dns, 53, udp, false},
			{"PostgreSQL", ServerMigrateJob, false, db, 5432, tcp, false},
		})
	})
}

func TestRender_ServiceMonitors(t *testing.T) {
	p := sqliteServerParams()
	if objs := rendered(t, p); countKind(objs, "ServiceMonitor") != 0 {
		t.Fatal("ServiceMonitor rendered by default")
	}
	p.ServiceMonitor = true
	objs := rendered(t, p)
	if n := countKind(objs, "ServiceMonitor"); n != 2 {
		t.Fatalf("%d ServiceMonitors, want 2", n)
	}
	for name, svcName := range map[string]string{ServerName: ServerMetricsService, "compass-callout": "compass-callout-metrics"} {
		sm := only[*unstructured.Unstructured](t, objs, p.CalloutNamespace, name)
		svc := only[*corev1.Service](t, objs, p.CalloutNamespace, svcName)
		sel, found, err := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		if err != nil || !found {
			t.Fatalf("%s: spec.selector.matchLabels: found %v, %v", name, found, err)
		}
		checkSelects(t, name+" ServiceMonitor", sel, svc.Labels)
		// It must select only its metrics Service, not the door Service.
		for _, o := range objs {
			if s, ok := o.(*corev1.Service); ok && s.Name != svcName && labels.SelectorFromSet(sel).Matches(labels.Set(s.Labels)) {
				t.Errorf("%s ServiceMonitor also selects Service %s", name, s.Name)
			}
		}
		eps, found, err := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		if err != nil || !found || len(eps) != 1 {
			t.Fatalf("%s: spec.endpoints = %v (%v, %v), want one", name, eps, found, err)
		}
		ep, _ := eps[0].(map[string]any)
		if ep["port"] != svc.Spec.Ports[0].Name || ep["path"] != "/metrics" || ep["interval"] != "30s" || len(ep) != 3 {
			t.Fatalf("%s: endpoint = %v, want port %s, path /metrics, interval 30s", name, ep, svc.Spec.Ports[0].Name)
		}
		// jobLabel: the job is the Service's app.kubernetes.io/name, which
		// the rules and docs/self-host.md use (TestMonitorsSetTheJobTheRulesUse).
		if jl, _, _ := unstructured.NestedString(sm.Object, "spec", "jobLabel"); jl != MonitorJobLabel || svc.Labels[jl] != name {
			t.Fatalf("%s: jobLabel %q gives job %q, want %s", name, jl, svc.Labels[jl], name)
		}
		if spec, _ := sm.Object["spec"].(map[string]any); len(spec) != 3 || len(sm.Object) != 4 {
			t.Fatalf("%s: unexpected fields in %v", name, sm.Object)
		}
	}
}

func countKind(objs []runtime.Object, kind string) int {
	n := 0
	for _, o := range objs {
		if fmtKind(o) == kind {
			n++
		}
	}
	return n
}
