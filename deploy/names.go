package deploy

import "time"

// The chart's fixed names, paths and settings (deploy/chart/compass,
// templates/_view.tpl), which the tests and docs name too;
// TestViewConstantsAreTheDeployPackages keeps the two equal.

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

const (
	// natsTLSDir and natsRouteTLSDir are where the client and route
	// certificate Secrets are mounted in the nats-server pod.
	natsTLSDir      = "/etc/nats/tls"
	natsRouteTLSDir = "/etc/nats/route-tls"
	// natsGatewayTLSDir is where the gateway certificate Secret is mounted.
	natsGatewayTLSDir = "/etc/nats/gateway-tls"
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
	// natsServerNameEnv is each cluster server's name, its pod's name; with
	// a gateway, <pod>.<gateway name>, from natsPodNameEnv defined before
	// it: a server name must be unique in the whole supercluster, and the
	// pods of every region are nats-0, nats-1, ...
	natsServerNameEnv = "COMPASS_NATS_SERVER_NAME"
	natsPodNameEnv    = "COMPASS_NATS_POD_NAME"
	// natsGatewayPasswordEnv holds the gateway password (from
	// NATSGatewaySecret).
	natsGatewayPasswordEnv = "COMPASS_NATS_GATEWAY_PASSWORD"
	// podIPEnv is the pod's IP from the downward API; the Runner's health and
	// the callout's metrics listeners bind it.
	podIPEnv = "COMPASS_POD_IP"
	// natsHeadlessService is the cluster's headless Service: it gives every
	// StatefulSet pod its stable name nats-<i>.nats-headless.<namespace>.svc.
	natsHeadlessService = "nats-headless"
	// natsGatewayService is the Service of the gateway port alone, which an
	// operator exposes to the other regions (nats.gateway.serviceType).
	natsGatewayService = "nats-gateway"
	// authTimeoutSeconds: see deploy/nats/README.md (Auth timeout).
	authTimeoutSeconds = 5
)
