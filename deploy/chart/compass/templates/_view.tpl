{{- /*
The view: every value the templates print, derived from .Values in this one
place. Each template starts with

  {{- $v := include "compass.view" . | fromJson }}   (not used: numbers)
  {{- $v := dict }}{{- $_ := include "compass.view" (dict "v" $v "root" .) }}
  {{- with $v }} ... {{- end }}

so its body reads .ClusterName, .Names.ClientPort, and so on, with their
types kept (a port is an int, not the float64 a values file gives). The
fixed names and limits are the deploy package's constants (deploy/params.go,
deploy/render.go); TestViewConstantsAreTheDeployPackages keeps them equal.
*/}}
{{- define "compass.view" }}
{{- $v := .v }}
{{- $root := .root }}
{{- $V := $root.Values }}
{{- /* the rules values.schema.json cannot say (templates/_validate.tpl) */}}
{{- include "compass.validate" $root }}
{{- /* parameters */}}
{{- $_ := set $v "Namespace" $V.namespaces.runner }}
{{- $_ := set $v "CalloutNamespace" $V.namespaces.callout }}
{{- $_ := set $v "CreateCalloutNamespace" (ne $V.namespaces.createCallout false) }}
{{- $_ := set $v "ClusterName" (required "clusterName is required: this cluster's name in the Server's cluster file, [a-z0-9-]{1,40}" $V.clusterName) }}
{{- $_ := set $v "ServerURL" (required "serverURL is required: the Server's door, https://" $V.serverURL) }}
{{- $_ := set $v "NATSURL" $V.natsURL }}
{{- $_ := set $v "RunnerImage" (include "compass.image" (dict "image" $V.runner.image "root" $root "compass" true)) }}
{{- $_ := set $v "CalloutImage" (include "compass.image" (dict "image" $V.callout.image "root" $root "compass" true)) }}
{{- $_ := set $v "NATSImage" "" }}
{{- if $V.nats.enabled }}
{{- $_ := set $v "NATSImage" (include "compass.image" (dict "image" $V.nats.image "root" $root "compass" false)) }}
{{- end }}
{{- $_ := set $v "ServerImage" "" }}
{{- if $V.server.enabled }}
{{- $_ := set $v "ServerImage" (include "compass.image" (dict "image" $V.server.image "root" $root "compass" true)) }}
{{- end }}
{{- $_ := set $v "CABundle" $V.caBundle }}
{{- $_ := set $v "CABundleConfigMap" (ternary "compass-ca" $V.caBundleConfigMap (ne $V.caBundle "")) }}
{{- $_ := set $v "CalloutReplicas" (int $V.callout.replicas) }}
{{- $_ := set $v "NATSAccount" $V.callout.account }}
{{- $_ := set $v "NATSCalloutIssuer" ($V.callout.issuer | default "REPLACE_WITH_CALLOUT_ISSUER_ACCOUNT_PUBLIC_KEY") }}
{{- $_ := set $v "NATSCalloutXKey" ($V.callout.xkey | default "REPLACE_WITH_CALLOUT_XKEY_PUBLIC_KEY") }}
{{- $_ := set $v "CalloutNextXKey" (eq $V.callout.nextXKey true) }}
{{- $_ := set $v "CalloutNextIssuer" (eq $V.callout.nextIssuer true) }}
{{- /* operator mode: the accounts and users are an operator's JWTs */}}
{{- $operator := eq ($V.callout.mode | default "server-config") "operator" }}
{{- $_ := set $v "OperatorMode" $operator }}
{{- $_ := set $v "CalloutMode" (ternary "operator" "server-config" $operator) }}
{{- $_ := set $v "CalloutAccount" ($V.callout.calloutAccount | default "") }}
{{- $_ := set $v "CalloutNextUserSigning" (eq $V.callout.nextUserSigning true) }}
{{- $op := $V.nats.operator | default dict }}
{{- $_ := set $v "NATSOperatorResolver" ($op.resolver | default "") }}
{{- $_ := set $v "NATSSentinel" ($op.sentinel | default "") }}
{{- $_ := set $v "NATSTLSSecret" $V.nats.tlsSecret }}
{{- $_ := set $v "NATSMonitor" $V.nats.monitor }}
{{- $_ := set $v "NATSRouteTLSSecret" $V.nats.routeTLSSecret }}
{{- $_ := set $v "ServerDatabaseSecret" $V.server.databaseSecret }}
{{- $_ := set $v "CalloutDatabaseSecret" (default $V.server.databaseSecret $V.server.calloutDatabaseSecret) }}
{{- $_ := set $v "ServerTLSSecret" $V.server.tlsSecret }}
{{- $_ := set $v "ServerStorage" $V.server.storage.size }}
{{- $_ := set $v "ServerStorageClass" $V.server.storage.storageClass }}
{{- $_ := set $v "BackupSchedule" $V.server.backup.schedule }}
{{- $_ := set $v "BackupClaim" $V.server.backup.claim }}
{{- $_ := set $v "BackupKeepCopies" (int ($V.server.backup.keep | default 7)) }}
{{- $_ := set $v "NetworkPolicies" $V.networkPolicies.enabled }}
{{- $_ := set $v "DoorIngressCIDRs" $V.networkPolicies.doorIngressCIDRs }}
{{- $_ := set $v "MetricsNamespace" $V.networkPolicies.metricsNamespace }}
{{- $_ := set $v "DatabaseCIDR" $V.networkPolicies.databaseCIDR }}
{{- $_ := set $v "DatabasePort" (int $V.networkPolicies.databasePort) }}
{{- $_ := set $v "IssuerCIDRs" $V.networkPolicies.issuerCIDRs }}
{{- $_ := set $v "NATSCIDRs" $V.networkPolicies.natsCIDRs }}
{{- $_ := set $v "DoorEgressCIDRs" $V.networkPolicies.doorEgressCIDRs }}
{{- $_ := set $v "APIServerCIDRs" ($V.networkPolicies.apiServerCIDRs | default list) }}
{{- /* the doors' TokenReview of this cluster's Runner tokens */}}
{{- $_ := set $v "TokenReview" (eq ($V.tokenReview | default dict).enabled true) }}
{{- $_ := set $v "TokenReviewWatchPods" (eq ($V.tokenReview | default dict).watchPods true) }}
{{- $_ := set $v "KubeAPI" (dict "Dir" "/var/run/secrets/compass/kube" "Role" "compass-token-reviewer" "PodRole" "compass-runner-pod-watcher" "TokenSeconds" 3600) }}
{{- $_ := set $v "ServiceMonitor" $V.monitoring.serviceMonitor }}
{{- $_ := set $v "PrometheusRule" $V.monitoring.prometheusRule }}
{{- $_ := set $v "GrafanaDashboard" $V.monitoring.grafanaDashboard }}
{{- /* fixed names (deploy/params.go) */}}
{{- $_ := set $v "PolicyName" "compass-runner-identity" }}
{{- $_ := set $v "ContainmentPolicyName" "compass-runner-containment" }}
{{- $_ := set $v "ServiceAccount" "compass-runner" }}
{{- $_ := set $v "DaemonSet" "compass-runner" }}
{{- $_ := set $v "Audience" "compass-runner" }}
{{- $_ := set $v "TokenDir" "/var/run/secrets/compass/runner" }}
{{- $_ := set $v "TokenPath" "/var/run/secrets/compass/runner/token" }}
{{- $_ := set $v "TokenExpirationSeconds" (int64 $V.token.expirationSeconds) }}
{{- $_ := set $v "MaxTokenLifetimeSeconds" (int64 $V.token.maxLifetimeSeconds) }}
{{- $_ := set $v "AuthTimeoutSeconds" 5 }}
{{- $_ := set $v "RunnerHealthPort" 8081 }}
{{- $_ := set $v "Names" (dict
      "UsersSecret" "compass-nats-users" "RouteSecret" "compass-nats-route" "RouteUser" "compass-route"
      "TLSDir" "/etc/nats/tls" "RouteTLSDir" "/etc/nats/route-tls"
      "RoutePasswordEnv" "COMPASS_NATS_ROUTE_PASSWORD" "RouteURLsEnv" "COMPASS_NATS_ROUTE_URLS"
      "ServerNameEnv" "COMPASS_NATS_SERVER_NAME" "PodIPEnv" "COMPASS_POD_IP"
      "Headless" "nats-headless" "ClientPort" 4222 "RoutePort" 6222 "MonitorPort" 8222
      "GatewaySecret" "compass-nats-gateway" "GatewayUser" "compass-gateway" "GatewayTLSDir" "/etc/nats/gateway-tls"
      "GatewayPasswordEnv" "COMPASS_NATS_GATEWAY_PASSWORD" "PodNameEnv" "COMPASS_NATS_POD_NAME"
      "GatewayService" "nats-gateway") }}
{{- $_ := set $v "Server" (dict
      "Name" "compass-server" "MetricsService" "compass-server-metrics" "NATSSecret" "compass-server-nats"
      "ClustersConfigMap" "compass-runner-clusters" "MigrateJob" "compass-server-migrate"
      "BackupCronJob" "compass-server-backup" "BackupDir" "/backup"
      "DataDir" "/var/lib/compass" "TLSDir" "/etc/compass/tls"
      "SecretsDir" "/var/run/secrets/compass/server" "ClustersDir" "/etc/compass/clusters"
      "DoorPort" 8443 "MetricsPort" 9090 "IssuerPort" 443) }}
{{- /* the policy's CEL lists: validUsers refused quotes and backslashes */}}
{{- $_ := set $v "ControllersCEL" (include "compass.celList" $V.policy.controllers) }}
{{- $_ := set $v "DeployersCEL" (include "compass.celList" $V.policy.deployers) }}
{{- /* NATS: how many servers, where monitoring listens, the routes */}}
{{- $servers := int $V.nats.replicas }}
{{- if eq $servers 0 }}{{ $servers = ternary 3 1 $V.nats.cluster }}{{ end }}
{{- $_ := set $v "NATSServers" $servers }}
{{- $_ := set $v "NATSClustered" (gt $servers 1) }}
{{- $_ := set $v "NATSMonitorListen" "" }}
{{- if eq $V.nats.monitor "loopback" }}{{ $_ := set $v "NATSMonitorListen" "127.0.0.1:8222" }}{{ end }}
{{- if eq $V.nats.monitor "pod" }}{{ $_ := set $v "NATSMonitorListen" "0.0.0.0:8222" }}{{ end }}
{{- $peers := list }}
{{- $urls := list }}
{{- if gt $servers 1 }}
{{- range $i := until $servers }}
{{- $peer := printf "nats-%d.nats-headless.%s.svc:6222" $i $V.namespaces.callout }}
{{- $peers = append $peers $peer }}
{{- $urls = append $urls (printf "%q" (printf "tls://compass-route:$(COMPASS_NATS_ROUTE_PASSWORD)@%s" $peer)) }}
{{- end }}
{{- end }}
{{- $_ := set $v "NATSPeers" $peers }}
{{- $_ := set $v "NATSRouteURLs" (ternary (printf "[%s]" (join ", " $urls)) "" (gt $servers 1)) }}
{{- /* NATS gateway: this region of a supercluster (templates/_validate.tpl
has checked the values when enabled). The cluster takes the gateway's name,
as nats-server requires, and each server is <pod>.<gateway>, a name unique
in the whole supercluster. The servers dial the other regions on the ports
of their URLs, and the gateway port itself (what servers tell each other
when no advertise address is set). */}}
{{- $gw := $V.nats.gateway }}
{{- $gateway := eq $gw.enabled true }}
{{- $_ := set $v "NATSGateway" $gateway }}
{{- $_ := set $v "NATSGatewayName" $gw.name }}
{{- $_ := set $v "NATSGatewayPort" (int $gw.port) }}
{{- $_ := set $v "NATSGatewayTLSSecret" $gw.tlsSecret }}
{{- $_ := set $v "NATSGatewayAdvertise" $gw.advertise }}
{{- $_ := set $v "NATSGatewayServiceType" $gw.serviceType }}
{{- $_ := set $v "NATSGatewayServiceAnnotations" ($gw.serviceAnnotations | default dict) }}
{{- $_ := set $v "NATSClusterName" (ternary (printf "%q" $gw.name) "nats" $gateway) }}
{{- $_ := set $v "NATSServerNameValue" (printf "$(COMPASS_NATS_POD_NAME).%s" $gw.name) }}
{{- $remotes := list }}
{{- $gwPorts := list (printf "%05d" (int $gw.port)) }}
{{- range $r := $gw.remotes }}
{{- $quoted := list }}
{{- range $u := $r.urls }}
{{- $quoted = append $quoted (printf "%q" $u) }}
{{- $gwPorts = append $gwPorts (printf "%05d" (atoi (regexReplaceAll "^.*:" $u ""))) }}
{{- end }}
{{- $remotes = append $remotes (dict "Name" $r.name "URLs" $r.urls "URLList" (printf "[%s]" (join ", " $quoted))) }}
{{- end }}
{{- $_ := set $v "NATSGatewayRemotes" $remotes }}
{{- $sortedGW := list }}
{{- range $p := $gwPorts | uniq | sortAlpha }}{{ $sortedGW = append $sortedGW (atoi $p) }}{{ end }}
{{- $_ := set $v "NATSGatewayEgressPorts" $sortedGW }}
{{- $_ := set $v "GatewayCIDRs" ($V.networkPolicies.gatewayCIDRs | default list) }}
{{- /* the distinct ports of the NATS URLs, sorted (4222 without one) */}}
{{- $ports := list }}
{{- range $u := splitList "," $V.natsURL }}
{{- $port := regexFind ":[0-9]+$" (urlParse $u).host | trimPrefix ":" | default "4222" }}
{{- $ports = append $ports (printf "%05d" (int $port)) }}
{{- end }}
{{- $sorted := list }}
{{- range $p := $ports | uniq | sortAlpha }}{{ $sorted = append $sorted (atoi $p) }}{{ end }}
{{- $_ := set $v "NATSURLPorts" $sorted }}
{{- /* the door's port, as the Runners dial it (443 without one) */}}
{{- $_ := set $v "ServerURLPort" (int (regexFind ":[0-9]+$" (urlParse $V.serverURL).host | trimPrefix ":" | default "443")) }}
{{- /* the Server */}}
{{- $sqlite := empty $V.server.databaseSecret }}
{{- $_ := set $v "ServerSQLite" $sqlite }}
{{- $replicas := int $V.server.replicas }}
{{- if eq $replicas 0 }}{{ $replicas = ternary 1 2 $sqlite }}{{ end }}
{{- $_ := set $v "ServerReplicas" $replicas }}
{{- $inServerPod := and $V.server.enabled $sqlite }}
{{- $_ := set $v "CalloutInServerPod" $inServerPod }}
{{- $_ := set $v "Callout" (dict "MetricsPort" (ternary 9091 9090 $inServerPod) "MetricsPortName" (ternary "callout-metrics" "metrics" $inServerPod)) }}
{{- /* the nats-server pod's day-2 settings (deploy/render.go) */}}
{{- $watched := list "/etc/nats/config/nats.conf" "/etc/nats/tls/tls.crt" "/etc/nats/tls/tls.key" }}
{{- if gt $servers 1 }}
{{- $watched = concat $watched (list "/etc/nats/route-tls/tls.crt" "/etc/nats/route-tls/tls.key" "/etc/nats/route-tls/ca.crt") }}
{{- end }}
{{- if $gateway }}
{{- $watched = concat $watched (list "/etc/nats/gateway-tls/tls.crt" "/etc/nats/gateway-tls/tls.key" "/etc/nats/gateway-tls/ca.crt") }}
{{- end }}
{{- $_ := set $v "NATS" (dict
      "ConfigDir" "/etc/nats/config" "RunDir" "/var/run/nats" "PIDFile" "/var/run/nats/nats.pid"
      "LameDuckDuration" "30s" "LameDuckGrace" "10s" "TerminationGraceSeconds" 60
      "ReloadEverySeconds" 10 "ReloaderScript" (include "compass.natsReloaderScript" .)
      "WatchedFiles" $watched) }}
{{- /* the nats chart runs the tested nats-server (deploy.NATSImage) */}}
{{- $_ := set $v "NATSHelmImage" (dict "Repository" "nats" "Tag" "2.15.2-alpine") }}
{{- /* the operator's metadata and each workload's pods (templates/_workload.tpl) */}}
{{- include "compass.checkMetadata" $root }}
{{- $_ := set $v "CommonLabels" ($V.commonLabels | default dict) }}
{{- $_ := set $v "CommonAnnotations" ($V.commonAnnotations | default dict) }}
{{- $pods := dict }}
{{- range $w := list (list "Runner" $V.runner) (list "Callout" $V.callout) (list "NATS" $V.nats) (list "Server" $V.server) }}
{{- $W := index $w 1 }}
{{- $_ := set $pods (index $w 0) (dict
      "Labels" (merge dict ($W.podLabels | default dict) ($V.commonLabels | default dict))
      "Annotations" ($W.podAnnotations | default dict)
      "PriorityClassName" $W.priorityClassName
      "NodeSelector" $W.nodeSelector "Tolerations" $W.tolerations "Affinity" ($W.affinity | default dict)
      "Resources" $W.resources
      "ImagePullPolicy" $V.imagePullPolicy "ImagePullSecrets" $V.imagePullSecrets) }}
{{- end }}
{{- /* The chart's own spreading term (podAntiAffinity over hostnames) stays
unless the values give a podAntiAffinity of their own, which replaces it;
the values' other terms are added beside it. */}}
{{- $_ := set $pods.Callout "Spread" (not (hasKey $pods.Callout.Affinity "podAntiAffinity")) }}
{{- $_ := set $pods.NATS "Spread" (and (gt $servers 1) (not (hasKey $pods.NATS.Affinity "podAntiAffinity"))) }}
{{- $_ := set $pods.Server "Spread" (and (not $sqlite) (not (hasKey $pods.Server.Affinity "podAntiAffinity"))) }}
{{- $_ := set $pods.NATS "ReloaderResources" $V.nats.reloaderResources }}
{{- /* The backup CronJob and the migrate Job run the Server's image where
the Server may run: its tolerations, nodeSelector, priorityClassName and
affinity, never its podAffinity, which the chart's own term replaces on
SQLite (the pod must run beside the Server, on the node holding its
ReadWriteOnce volume). Their labels are the common ones, not the Server's
podLabels (a label asking a mesh to inject a sidecar would keep a Job from
ever completing); their resources are their own. */}}
{{- $besideServer := omit $pods.Server.Affinity "podAffinity" }}
{{- range $job := list (list "Backup" true) (list "Migrate" $sqlite) }}
{{- $_ := set $pods (index $job 0) (dict
      "Labels" ($V.commonLabels | default dict) "Annotations" dict
      "PriorityClassName" $V.server.priorityClassName
      "NodeSelector" $V.server.nodeSelector "Tolerations" $V.server.tolerations
      "Affinity" (ternary $besideServer $pods.Server.Affinity (index $job 1))
      "ImagePullPolicy" $V.imagePullPolicy "ImagePullSecrets" $V.imagePullSecrets) }}
{{- end }}
{{- /* nats-server reloads no change of its gateway block but its
certificates: a change of the gateway's name, port, advertise address or
remotes reaches the servers by a rolling restart, which this annotation of
their pods (a hash of those values) makes every upgrade that changes them
do. */}}
{{- if $gateway }}
{{- $gwHash := sha256sum (toJson (dict "name" $gw.name "port" (int $gw.port) "advertise" $gw.advertise "remotes" $gw.remotes)) }}
{{- $_ := set $pods.NATS "Annotations" (merge (dict "compass-runner.io/nats-gateway" $gwHash) $pods.NATS.Annotations) }}
{{- end }}
{{- $_ := set $v "Pods" $pods }}
{{- /* monitoring */}}
{{- $labels := list }}
{{- range $k := keys $V.monitoring.labels | sortAlpha }}
{{- $labels = append $labels (dict "Key" $k "Value" (get $V.monitoring.labels $k)) }}
{{- end }}
{{- $_ := set $v "MonitoringLabelList" $labels }}
{{- $_ := set $v "MonitorJobLabel" "app.kubernetes.io/name" }}
{{- $_ := set $v "PrometheusRuleName" "compass" }}
{{- $_ := set $v "DashboardConfigMap" "compass-dashboard" }}
{{- $_ := set $v "DashboardKey" "compass.json" }}
{{- $_ := set $v "RulesYAML" ($root.Files.Get "files/compass-rules.yaml") }}
{{- $_ := set $v "DashboardJSON" ($root.Files.Get "files/dashboard.json") }}
{{- /* the nats-server configuration, last: it reads the rest */}}
{{- $_ := set $v "NATSConfig" (include "compass.natsConfig" $v) }}
{{- end }}

{{- /* compass.celList: a list of names as a CEL list of single-quoted strings */}}
{{- define "compass.celList" }}
{{- $q := list }}
{{- range . }}{{ $q = append $q (printf "'%s'" .) }}{{ end }}
{{- printf "[%s]" (join ", " $q) }}
{{- end }}

{{- /* compass.imageRepository: registry/repository, imageRegistry replacing the registry */}}
{{- define "compass.imageRepository" }}
{{- $registry := .root.Values.imageRegistry | default .image.registry }}
{{- if $registry }}{{ $registry }}/{{ end }}{{ .image.repository }}
{{- end }}

{{- /* compass.image: registry/repository:tag@digest; a Compass image with neither tag nor digest is the appVersion's */}}
{{- define "compass.image" }}
{{- include "compass.imageRepository" . }}
{{- $tag := .image.tag }}
{{- if and (not $tag) (not .image.digest) .compass }}{{ $tag = .root.Chart.AppVersion }}{{ end }}
{{- if $tag }}:{{ $tag }}{{ end }}
{{- if .image.digest }}@{{ .image.digest }}{{ end }}
{{- end }}

{{- /* The nats-server configuration and the nats chart's values, each with
the view of the root it is given (compass-server manifests
--nats-helm-values; deploy.RenderNATSConfig). */}}
{{- define "compass.natsConfigOf" }}
{{- $v := dict }}{{- $_ := include "compass.view" (dict "v" $v "root" .) }}
{{- $v.NATSConfig }}
{{- end }}
{{- define "compass.natsHelmValuesOf" }}
{{- $v := dict }}{{- $_ := include "compass.view" (dict "v" $v "root" .) }}
{{- include "compass.natsHelmValues" $v }}
{{- end }}

{{- /* compass.indent: (list n text), every line indented by n spaces but
the empty ones, which stay empty (no trailing blanks in a block scalar). */}}
{{- define "compass.indent" }}
{{- regexReplaceAll "(?m)^[ ]+$" (indent (index . 0) (trimSuffix "\n" (index . 1))) "" }}
{{- end }}

{{- /* compass.viewJSON: the view as JSON, what every template reads (for
tests and for debugging a rendering: helm template cannot show it, but
TestViewConstantsAreTheDeployPackages reads it through deploy/chart). */}}
{{- define "compass.viewJSON" }}
{{- $v := dict }}{{- $_ := include "compass.view" (dict "v" $v "root" .) }}
{{- toJson (omit $v "NATSConfig" "RulesYAML" "DashboardJSON") }}
{{- end }}
