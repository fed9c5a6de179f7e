{{- /*
compass.validate: the rules values.schema.json cannot state, given the root
(.). It prints nothing; a value that breaks a rule stops the rendering with
fail, whose message starts with the value's name. The schema checks each
value by itself; these are the rules over several values (the namespaces
differ, expirationSeconds within maxLifetimeSeconds, the Server's replicas
on its database, the backup only beside the Server on SQLite, a NATS cluster
only with the in-cluster nats-server, the database network on PostgreSQL),
and the few a pattern states badly (a length in bytes, a whole image
reference, a CIDR's host bits, the NATS URLs).

They are deploy/validate.go's rules (Params.Validate), which compass-server
manifests runs before it renders this chart; a Helm user never runs them, so
the chart holds them itself. TestTheChartRefusesWhatValidateRefuses (deploy)
keeps the two in step.

The attacker model: whoever writes the values may be careless, not hostile
(they can install anything they like), but what they write reaches a
ValidatingAdmissionPolicy's CEL, a nats-server configuration and the
Runners' environment, where a malformed value weakens DL-440's guarantees
instead of failing. And a NATS URL's user part is a credential to nats.go,
a Server URL's too, so no message here repeats either URL: the schema
leaves a URL with an @ to these rules, and they name it by its place.
*/}}
{{- define "compass.validate" }}
{{- $V := .Values }}
{{- $root := . }}

{{- /* the two required values: values.yaml leaves them empty */}}
{{- if not $V.clusterName }}
{{- fail "clusterName: required: this cluster's name in the Server's cluster file, [a-z0-9-]{1,40} (--cluster-name)" }}
{{- end }}
{{- if not $V.serverURL }}
{{- fail "serverURL: required: the Server's door the Runners enroll at, https:// (--server-url)" }}
{{- end }}
{{- if contains "@" $V.serverURL }}
{{- fail "serverURL: has an @: a user part is a credential, and the door's URL carries none; give https://host[:port][/path]" }}
{{- end }}

{{- if and $V.caBundle $V.caBundleConfigMap }}
{{- fail "caBundle: set with caBundleConfigMap: give the CA either as PEM (the chart renders ConfigMap compass-ca) or as a ConfigMap of yours, not both" }}
{{- end }}

{{- /* The Runner's namespace holds the Runner alone and no RoleBinding
(DL-440 §Global Constraints): the callout's pods and Secrets go elsewhere. */}}
{{- if eq $V.namespaces.runner $V.namespaces.callout }}
{{- fail (printf "namespaces.callout: %q is also namespaces.runner: the Runner's namespace holds only the Runner" $V.namespaces.callout) }}
{{- end }}

{{- /* A projected token valid longer than the cluster file allows is
refused by the verifier at both doors. */}}
{{- $exp := int64 $V.token.expirationSeconds }}
{{- $max := int64 $V.token.maxLifetimeSeconds }}
{{- if gt $exp $max }}
{{- fail (printf "token.expirationSeconds: %d is above token.maxLifetimeSeconds (%d), this cluster's maxTokenLifetime: the doors would refuse every token" $exp $max) }}
{{- end }}

{{- /* The policy's usernames: JSON Schema's maxLength counts characters,
validUsers bounds bytes. */}}
{{- range $list := list "controllers" "deployers" }}
{{- range $i, $u := index $V.policy $list }}
{{- if gt (len $u) 600 }}
{{- fail (printf "policy.%s: entry %d is longer than 600 bytes" $list $i) }}
{{- end }}
{{- end }}
{{- end }}

{{- /* Each image as the templates print it: the parts the schema checked,
joined, must be one reference (deploy validImage); nats-server's has no
appVersion to fall back on. */}}
{{- range $w := list (list "runner" true true) (list "callout" true true) (list "nats" $V.nats.enabled false) (list "server" $V.server.enabled true) }}
{{- $name := index $w 0 }}
{{- if index $w 1 }}
{{- $img := (index $V $name).image }}
{{- $ref := include "compass.image" (dict "image" $img "root" $root "compass" (index $w 2)) }}
{{- if gt (len $ref) 512 }}
{{- fail (printf "%s.image: the reference is %d bytes, more than 512" $name (len $ref)) }}
{{- end }}
{{- if not (regexMatch `^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$` $ref) }}
{{- fail (printf "%s.image: %q is not an image reference (lower-case registry and path components, then a tag and/or a digest)" $name $ref) }}
{{- end }}
{{- if and (not (index $w 2)) (not $img.tag) (not $img.digest) }}
{{- fail (printf "%s.image: %q has neither a tag nor a digest" $name $ref) }}
{{- end }}
{{- end }}
{{- end }}

{{- /* The monitoring labels' keys: the schema checks their shape, not
the length of a key's prefix, at most 253 bytes (a DNS-1123 subdomain). */}}
{{- range $k, $x := $V.monitoring.labels }}
{{- if and (contains "/" $k) (gt (len (regexReplaceAll `/[^/]*$` $k "")) 253) }}
{{- fail (printf "monitoring.labels: key %q: the prefix is longer than 253 bytes" $k) }}
{{- end }}
{{- end }}

{{- /* The NATS URLs (deploy validNATSURLs, natsurl.CheckSealed): a Runner
sends its token in CONNECT, and the token is valid at the door until its
exp plus the leeway, so it never crosses a network in clear text: tls://,
or nats:// to a loopback host. WebSocket is refused: a Runner's user JWT
allows standard connections only. */}}
{{- range $i, $u := splitList "," $V.natsURL }}
{{- $n := add1 $i }}
{{- if contains "@" $u }}
{{- fail (printf "natsURL: URL %d of the list carries credentials (a user part before @): the Runner and the callout read theirs from files" $n) }}
{{- end }}
{{- if not (regexMatch `^[A-Za-z][A-Za-z0-9+.-]*://` $u) }}
{{- fail (printf "natsURL: URL %d of the list is not tls://host:port (or nats:// to a loopback host)" $n) }}
{{- end }}
{{- $scheme := lower (regexReplaceAll `://.*$` $u "") }}
{{- $rest := regexReplaceAll `^[^:]*://` $u "" }}
{{- if has $scheme (list "ws" "wss") }}
{{- fail (printf "natsURL: URL %d of the list is %s://: a Runner's user JWT allows standard connections only, not WebSocket; use tls://" $n $scheme) }}
{{- end }}
{{- if not (has $scheme (list "tls" "nats")) }}
{{- fail (printf "natsURL: URL %d of the list is not tls:// (or nats:// to a loopback host)" $n) }}
{{- end }}
{{- if not (regexMatch `^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&()*+;=-]+)(:[0-9]*)?/?$` $rest) }}
{{- fail (printf "natsURL: URL %d of the list must be tls://host:port, without path, query, space or quote" $n) }}
{{- end }}
{{- $host := regexReplaceAll `(:[0-9]*)?/?$` $rest "" }}
{{- $octet := `(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])` }}
{{- $loopback := or (eq (lower $host) "localhost")
      (regexMatch (printf `^127\.%s\.%s\.%s$` $octet $octet $octet) $host)
      (regexMatch (printf `^\[(::1|0{1,4}(:0{1,4}){6}:0{0,3}1|::[Ff]{4}:127\.%s\.%s\.%s)\]$` $octet $octet $octet) $host) }}
{{- if and (eq $scheme "nats") (not $loopback) }}
{{- fail (printf "natsURL: URL %d of the list is nats:// to %s, not a loopback host: a Runner's token would cross the network in clear text; use tls://" $n $host) }}
{{- end }}
{{- end }}

{{- /* NATS: a cluster (more than one server) is rendered only as the
in-cluster nats-server, whose routes need their certificate. */}}
{{- $servers := int $V.nats.replicas }}
{{- $what := printf "nats.replicas: %d" $servers }}
{{- if eq $servers 0 }}
{{- $servers = ternary 3 1 $V.nats.cluster }}
{{- $what = "nats.cluster: true (3 servers)" }}
{{- end }}
{{- if gt $servers 1 }}
{{- if not $V.nats.enabled }}
{{- fail (printf "%s: a cluster is rendered only with the in-cluster nats-server (nats.enabled); for your own NATS, see compass-server manifests --nats-helm-values" $what) }}
{{- end }}
{{- if not $V.nats.routeTLSSecret }}
{{- fail "nats.routeTLSSecret: empty: a cluster's routes need their certificate's Secret" }}
{{- end }}
{{- end }}

{{- /* The NATS gateway (deploy validGateway): only the in-cluster
nats-server as a cluster joins a supercluster; gateways are always TLS, so
one needs its certificate; the other regions are listed each once, this one
not among them, at URLs without credentials (the gateway password is a
Secret's), which nats-server dials as tls://host:port. */}}
{{- $gw := $V.nats.gateway }}
{{- $gwName := `^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$` }}
{{- $hostPort := `^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})$` }}
{{- if not $gw.enabled }}
{{- if or $gw.name $gw.remotes $gw.advertise }}
{{- fail "nats.gateway.enabled: false, but its name, remotes or advertise address is set: set nats.gateway.enabled to render it" }}
{{- end }}
{{- else }}
{{- if not $V.nats.enabled }}
{{- fail "nats.gateway.enabled: rendered only with the in-cluster nats-server (nats.enabled) as a cluster (nats.cluster); for your own NATS, configure its gateway yourself" }}
{{- end }}
{{- if lt $servers 2 }}
{{- fail "nats.gateway.enabled: a single nats-server: a gateway joins this region's NATS cluster to the other regions', set nats.cluster (or nats.replicas 2 to 9)" }}
{{- end }}
{{- if not $gw.name }}
{{- fail "nats.gateway.name: required with nats.gateway.enabled: this region's name in the supercluster, which every other region lists among its remotes" }}
{{- end }}
{{- if not (regexMatch $gwName $gw.name) }}
{{- fail (printf "nats.gateway.name: %q is not a DNS-1123 label of at most 40 characters" $gw.name) }}
{{- end }}
{{- range $taken := list (list 4222 "client") (list 6222 "route") (list 8222 "monitoring") }}
{{- if eq (int $gw.port) (index $taken 0) }}
{{- fail (printf "nats.gateway.port: %d is nats-server's %s port" (int $gw.port) (index $taken 1)) }}
{{- end }}
{{- end }}
{{- if not $gw.tlsSecret }}
{{- fail "nats.gateway.tlsSecret: empty: a gateway needs its certificate's Secret (tls.crt, tls.key, ca.crt); gateways are always TLS" }}
{{- end }}
{{- if and $gw.advertise (not (include "compass.hostPort" (list $hostPort $gw.advertise))) }}
{{- fail (printf "nats.gateway.advertise: %q is not host:port, the address the other regions reach this region's gateway at" $gw.advertise) }}
{{- end }}
{{- if not $gw.remotes }}
{{- fail "nats.gateway.remotes: empty: list every other region's gateway (name and urls); this region accepts gateway connections from those it lists only" }}
{{- end }}
{{- if gt (len $gw.remotes) 16 }}
{{- fail (printf "nats.gateway.remotes: %d entries, more than 16" (len $gw.remotes)) }}
{{- end }}
{{- $seenGW := list }}
{{- range $i, $r := $gw.remotes }}
{{- if not $r.name }}
{{- fail (printf "nats.gateway.remotes: entry %d has no name" $i) }}
{{- end }}
{{- if not (regexMatch $gwName $r.name) }}
{{- fail (printf "nats.gateway.remotes: entry %d: %q is not a gateway name (a DNS-1123 label of at most 40 characters)" $i $r.name) }}
{{- end }}
{{- if eq $r.name $gw.name }}
{{- fail (printf "nats.gateway.remotes: entry %d %q is this region's own gateway name: list the other regions only" $i $r.name) }}
{{- end }}
{{- if has $r.name $seenGW }}
{{- fail (printf "nats.gateway.remotes: entry %d %q is listed twice" $i $r.name) }}
{{- end }}
{{- $seenGW = append $seenGW $r.name }}
{{- if not $r.urls }}
{{- fail (printf "nats.gateway.remotes: entry %d %q has no URL" $i $r.name) }}
{{- end }}
{{- if gt (len $r.urls) 16 }}
{{- fail (printf "nats.gateway.remotes: entry %d %q has %d URLs, more than 16" $i $r.name (len $r.urls)) }}
{{- end }}
{{- range $j, $u := $r.urls }}
{{- $where := printf "nats.gateway.remotes: entry %d %q: URL %d" $i $r.name (add1 $j) }}
{{- if contains "@" $u }}
{{- fail (printf "%s carries credentials: the gateway password comes from Secret compass-nats-gateway" $where) }}
{{- end }}
{{- if or (not (contains "://" $u)) (not (has (lower (regexReplaceAll "(?s)://.*$" $u "")) (list "tls" "nats"))) }}
{{- fail (printf "%s %q is not tls:// (or nats://: a gateway connection is TLS either way)" $where $u) }}
{{- end }}
{{- if not (include "compass.hostPort" (list $hostPort (regexReplaceAll "(?s)^.*?://" $u ""))) }}
{{- fail (printf "%s %q must be tls://host:port, without path, query, space or quote" $where $u) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- /* The NATS auth mode. Operator mode takes its accounts and users from
an operator's JWTs (nats.operator), so the values name keys where
server-config mode names accounts; a value of the other mode is refused
rather than ignored, so a half-switched values file fails here and not as
a lockout at the next NATS restart. */}}
{{- $akey := "^A[A-Z2-7]{55}$" }}
{{- $op := $V.nats.operator | default dict }}
{{- if eq ($V.callout.mode | default "server-config") "operator" }}
{{- if not (regexMatch $akey $V.callout.account) }}
{{- fail (printf "callout.account: %q in operator mode: give the RUNNERS account's public key (A and 55 base32 characters: nsc describe account RUNNERS --field sub), not its name" $V.callout.account) }}
{{- end }}
{{- if not (regexMatch $akey ($V.callout.calloutAccount | default "")) }}
{{- fail "callout.calloutAccount: required in operator mode: the AUTH account's public key (A and 55 base32 characters: nsc describe account AUTH --field sub)" }}
{{- end }}
{{- if eq $V.callout.calloutAccount $V.callout.account }}
{{- fail "callout.calloutAccount: is also callout.account: the callout's account (AUTH) and the Runners' (RUNNERS) are two accounts" }}
{{- end }}
{{- if not $op.resolver }}
{{- fail "nats.operator.resolver: required in operator mode: the resolver block of nsc generate config --mem-resolver (helm --set-file nats.operator.resolver=resolver.conf)" }}
{{- end }}
{{- range $key := list "operator" "system_account" "resolver_preload" }}
{{- if not (regexMatch (printf `(?m)^\s*%s\s*[:=]` $key) $op.resolver) }}
{{- fail (printf "nats.operator.resolver: has no %s: give the whole file nsc generate config --mem-resolver writes" $key) }}
{{- end }}
{{- end }}
{{- if not $op.sentinel }}
{{- fail "nats.operator.sentinel: required in operator mode: the sentinel's user JWT (nsc describe user --account AUTH --name sentinel --raw), without which no Runner's CONNECT reaches the callout" }}
{{- end }}
{{- if or $V.callout.issuer $V.callout.xkey }}
{{- fail "callout.issuer: set in operator mode (or callout.xkey): AUTH's account JWT in nats.operator.resolver names the callout's keys; leave both empty" }}
{{- end }}
{{- else }}
{{- if or $op.resolver $op.sentinel $V.callout.calloutAccount }}
{{- fail "nats.operator: set in server-config mode (or callout.calloutAccount): set callout.mode operator, or leave them empty" }}
{{- end }}
{{- if $V.callout.nextUserSigning }}
{{- fail "callout.nextUserSigning: true in server-config mode: the Runners' account's signing key is operator mode's; server-config mode's issuer signs the user JWTs (callout.nextIssuer)" }}
{{- end }}
{{- end }}
{{- if and $V.callout.nextUserSigning (not $V.callout.nextXKey) }}
{{- fail "callout.nextUserSigning: true without callout.nextXKey: in operator mode a next signing key comes with a next xkey, which tells the callout which keys a server accepts" }}
{{- end }}
{{- if and $V.callout.nextIssuer (not $V.callout.nextXKey) (eq $V.callout.mode "operator") }}
{{- fail "callout.nextIssuer: true without callout.nextXKey: in operator mode a next signing key comes with a next xkey, which tells the callout which keys a server accepts" }}
{{- end }}

{{- if and ($V.tokenReview | default dict).watchPods (not ($V.tokenReview | default dict).enabled) }}
{{- fail "tokenReview.watchPods: true without tokenReview.enabled: the pod watch is part of the doors' token review" }}
{{- end }}

{{- /* The Server: SQLite is one file on one volume that one Server writes;
PostgreSQL keeps two or more answering while one is drained. */}}
{{- $sqlite := not $V.server.databaseSecret }}
{{- if $V.server.enabled }}
{{- $replicas := int $V.server.replicas }}
{{- if eq $replicas 0 }}{{ $replicas = ternary 1 2 $sqlite }}{{ end }}
{{- if and $sqlite (ne $replicas 1) }}
{{- fail (printf "server.replicas: %d with SQLite: the database is one file on one volume that one Server writes; for 2 or more, use PostgreSQL (server.databaseSecret)" $replicas) }}
{{- end }}
{{- if and (not $sqlite) (lt $replicas 2) }}
{{- fail (printf "server.replicas: %d on PostgreSQL is below 2: one Server answers while another is drained or rescheduled" $replicas) }}
{{- end }}
{{- if not $V.server.tlsSecret }}
{{- fail "server.tlsSecret: empty: the door's certificate Secret is required" }}
{{- end }}
{{- if and $sqlite (not $V.server.storage.size) }}
{{- fail "server.storage.size: empty: the Server on SQLite needs its volume's size (for example 1Gi)" }}
{{- end }}
{{- if and $V.server.calloutDatabaseSecret $sqlite }}
{{- fail "server.calloutDatabaseSecret: set, but the Server is on SQLite: the callout reads its file in the Server's pod; it is for PostgreSQL (server.databaseSecret)" }}
{{- end }}
{{- else }}
{{- if $V.server.databaseSecret }}
{{- fail "server.databaseSecret: set, but server.enabled is false: the Server is rendered only when enabled" }}
{{- end }}
{{- if $V.server.calloutDatabaseSecret }}
{{- fail "server.calloutDatabaseSecret: set, but server.enabled is false: the Server is rendered only when enabled" }}
{{- end }}
{{- if ne (int $V.server.replicas) 0 }}
{{- fail (printf "server.replicas: %d, but server.enabled is false: the Server is rendered only when enabled" (int $V.server.replicas)) }}
{{- end }}
{{- if $V.server.migrateJob }}
{{- fail "server.migrateJob: the migrate Job is the Server's: set server.enabled and the Server's image and database values" }}
{{- end }}
{{- end }}

{{- /* The backup copies the Server's SQLite database from its volume;
PostgreSQL is backed up with pg_dump (docs/store.md). */}}
{{- $b := $V.server.backup }}
{{- if not $b.schedule }}
{{- if or $b.claim (ne (int $b.keep) 0) }}
{{- fail "server.backup.schedule: empty, but server.backup.claim or server.backup.keep is set: the backup CronJob is rendered only with a schedule" }}
{{- end }}
{{- else }}
{{- if not (and $V.server.enabled $sqlite) }}
{{- fail "server.backup.schedule: the backup CronJob copies the Server's SQLite database (server.enabled, without server.databaseSecret); back PostgreSQL up with pg_dump on its own schedule (docs/store.md)" }}
{{- end }}
{{- if not $b.claim }}
{{- fail "server.backup.claim: empty: the backup CronJob writes into an existing PersistentVolumeClaim, which a schedule needs" }}
{{- end }}
{{- end }}

{{- /* The NetworkPolicies: the networks as the API server takes them, and
PostgreSQL's network, without which the Server could not reach it. */}}
{{- $np := $V.networkPolicies }}
{{- if $np.enabled }}
{{- if not $np.issuerCIDRs }}
{{- fail "networkPolicies.issuerCIDRs: empty: no issuer would be reachable, so no key set could be fetched" }}
{{- end }}
{{- $lists := list (list "networkPolicies.doorIngressCIDRs" $np.doorIngressCIDRs) (list "networkPolicies.issuerCIDRs" $np.issuerCIDRs) (list "networkPolicies.natsCIDRs" $np.natsCIDRs) (list "networkPolicies.doorEgressCIDRs" $np.doorEgressCIDRs) (list "networkPolicies.gatewayCIDRs" ($np.gatewayCIDRs | default list)) }}
{{- if $np.databaseCIDR }}
{{- $lists = append $lists (list "networkPolicies.databaseCIDR" (list $np.databaseCIDR)) }}
{{- end }}
{{- range $l := $lists }}
{{- $seen := list }}
{{- range $i, $c := index $l 1 }}
{{- $key := include "compass.cidrKey" $c }}
{{- if eq $key "" }}
{{- fail (printf "%s: entry %d %q has host bits set past its prefix length (the API server refuses it)" (index $l 0) $i $c) }}
{{- end }}
{{- if has $key $seen }}
{{- fail (printf "%s: entry %d %q is listed twice" (index $l 0) $i $c) }}
{{- end }}
{{- $seen = append $seen $key }}
{{- end }}
{{- end }}
{{- if not $np.metricsNamespace }}
{{- fail "networkPolicies.metricsNamespace: empty: the namespace whose pods may scrape the metrics ports is required" }}
{{- end }}
{{- if $np.databaseCIDR }}
{{- if lt (int $np.databasePort) 1 }}
{{- fail (printf "networkPolicies.databasePort: %d is not a TCP port" (int $np.databasePort)) }}
{{- end }}
{{- else if and $V.server.enabled (not $sqlite) }}
{{- fail "networkPolicies.databaseCIDR: empty: the Server on PostgreSQL needs its network in the NetworkPolicy (or disable networkPolicies)" }}
{{- end }}
{{- end }}
{{- end }}

{{- /* compass.hostPort: (list expression s), non-empty when s is host:port
(the expression, deploy hostPortRE) with a port from 1 to 65535. */}}
{{- define "compass.hostPort" }}
{{- $s := index . 1 }}
{{- if regexMatch (index . 0) $s }}
{{- $port := atoi (regexReplaceAll "^.*:" $s "") }}
{{- if and (ge $port 1) (le $port 65535) }}ok{{ end }}
{{- end }}
{{- end }}

{{- /* compass.cidrKey: a CIDR the schema has shaped (IPv4, or IPv6 without
an embedded IPv4 address) as its address's numbers and its length, one
spelling per network, so two spellings of one IPv6 network are seen as
one; empty when an address bit past the length is set, which the API
server refuses (10.0.0.1/8). */}}
{{- define "compass.cidrKey" }}
{{- $addr := regexReplaceAll `/.*$` . "" }}
{{- $bits := int (regexReplaceAll `^.*/` . "") }}
{{- $pow := list 1 2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536 }}
{{- $groups := list }}
{{- $width := 8 }}
{{- if contains "." $addr }}
{{- range splitList "." $addr }}{{ $groups = append $groups (atoi .) }}{{ end }}
{{- else }}
{{- $width = 16 }}
{{- $head := list }}
{{- $tail := list }}
{{- if contains "::" $addr }}
{{- $parts := splitList "::" $addr }}
{{- with index $parts 0 }}{{ $head = splitList ":" . }}{{ end }}
{{- with index $parts 1 }}{{ $tail = splitList ":" . }}{{ end }}
{{- else }}
{{- $head = splitList ":" $addr }}
{{- end }}
{{- range $head }}{{ $groups = append $groups (int64 (printf "0x%s" .)) }}{{ end }}
{{- range until (int (sub 8 (add (len $head) (len $tail)))) }}{{ $groups = append $groups 0 }}{{ end }}
{{- range $tail }}{{ $groups = append $groups (int64 (printf "0x%s" .)) }}{{ end }}
{{- end }}
{{- $masked := true }}
{{- range $i, $g := $groups }}
{{- $host := min $width (max 0 (sub (mul (add1 $i) $width) $bits)) }}
{{- if ne (mod $g (index $pow $host)) 0 }}{{ $masked = false }}{{ end }}
{{- end }}
{{- if $masked }}{{ join "." $groups }}/{{ $bits }}{{ end }}
{{- end }}
