{{- define "compass.natsHelmValues" -}}
{{- if .OperatorMode }}{{ fail "callout.mode: operator: the nats chart's values (--nats-helm-values) are rendered for server-config mode only; in operator mode, give the nats chart the resolver and the sentinel as in ConfigMap compass-nats-config" }}{{ end }}
{{- if .NATSGateway }}{{ fail "nats.gateway.enabled: the nats chart's values (--nats-helm-values) carry no gateway; give the nats chart's config.gateway the gateway block of ConfigMap compass-nats-config, or install NATS with this chart (nats.enabled)" }}{{ end }}
# Values for the official nats Helm chart (nats-io/k8s, chart "nats", 1.x),
# rendered by `compass-server manifests --nats-helm-values`: the same
# nats-server configuration as the compass-nats-config ConfigMap, for a NATS
# installed with the chart instead of --nats-image. Install it in the callout
# namespace, where the Secrets below live:
#   helm install nats nats/nats -n {{ .CalloutNamespace }} -f compass-nats-values.yaml
# Secrets are referenced by name, never written here: the chart's container
# reads them into its environment, and the configuration names them as
# $VARIABLE (the chart writes "<< $X >>" unquoted into nats.conf).
# docs/self-host.md ("Running NATS as a cluster") maps every key.

# Names the StatefulSet nats, its pods nats-<i> and its headless Service
# {{ .Names.Headless }}, which the route URLs below and the certificates use.
fullnameOverride: nats

# nats-box would connect without the TLS and credentials this server requires.
natsBox:
  enabled: false

config:
  nats:
    port: {{ .Names.ClientPort }}
    # Clients connect over TLS only (a Runner's CONNECT carries its token).
    tls:
      enabled: true
      secretName: {{ quote .NATSTLSSecret }}       # tls.crt, tls.key
{{- if eq .NATSMonitorListen "" }}

  # No monitoring endpoint (the chart's HTTP probes go with it).
  monitor:
    enabled: false
{{- else if eq .NATSMonitor "pod" }}

  # Monitoring on every pod address ({{ .NATSMonitorListen }}), with the chart's /healthz probes:
  # no authentication, and /connz lists every Runner ID and address.
  monitor:
    enabled: true
    port: {{ .Names.MonitorPort }}
{{- else }}

  # Monitoring on loopback only (merge.http below): no authentication, and
  # /connz lists every Runner ID and address. The chart's HTTP probes need the
  # monitor port, so the pods run without them.
  monitor:
    enabled: false
{{- end }}

  cluster:
{{- if .NATSClustered }}
    enabled: true
    replicas: {{ .NATSServers }}
    port: {{ .Names.RoutePort }}
    # Mutual TLS between the servers: the chart adds ca_file and verify: true
    # when ca is set.
    tls:
      enabled: true
      secretName: {{ quote .NATSRouteTLSSecret }}  # tls.crt, tls.key, ca.crt
      ca: ca.crt
    merge:
      # The chart writes no_advertise: true; clients learn every server as
      # from the rendered configuration.
      no_advertise: false
      authorization:
        user: {{ quote .Names.RouteUser }}
        password: "<< ${{ .Names.RoutePasswordEnv }} >>"
        timeout: 3
      # Replaces the chart's own route list: these URLs carry the route
      # password (from container.env below) and name
{{- range .NATSPeers }}
      #   {{ . }}
{{- end }}
      routes: "<< ${{ .Names.RouteURLsEnv }} >>"
{{- else }}
    enabled: false
{{- end }}

  merge:
{{- if and .NATSMonitorListen (ne .NATSMonitor "pod") }}
    http: {{ quote .NATSMonitorListen }}
{{- end }}
    accounts:
      AUTH:
        users:
          - user: compass-callout
            password: "<< $COMPASS_CALLOUT_NATS_PASSWORD >>"
      {{ .NATSAccount }}:
        users:
          - user: compass-server
            password: "<< $COMPASS_SERVER_NATS_PASSWORD >>"
      # The system account's only user: compass-callout's kick identity,
      # which may list the servers' connections and end them and follow the
      # Runners' account's connect and disconnect events, nothing else
      # (the rendered nats.conf says why).
      SYS:
        users:
          - user: compass-kick
            password: "<< $COMPASS_KICK_NATS_PASSWORD >>"
            permissions:
              publish:
                allow: ["$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.*.CONNZ", "$SYS.REQ.SERVER.*.KICK"]
              subscribe:
                allow: ["_INBOX.>", "$SYS.ACCOUNT.{{ .NATSAccount }}.CONNECT", "$SYS.ACCOUNT.{{ .NATSAccount }}.DISCONNECT"]
    system_account: SYS
    authorization:
      timeout: {{ .AuthTimeoutSeconds }}
      auth_callout:
        issuer: {{ .NATSCalloutIssuer }}
        auth_users: [compass-callout, compass-server, compass-kick]
        account: AUTH
        xkey: {{ .NATSCalloutXKey }}

container:
  # The nats-server the tests run: go.mod's version (deploy.NATSImage), not
  # whatever the chart's release defaults to.
  image:
    repository: {{ quote .NATSHelmImage.Repository }}
    tag: {{ quote .NATSHelmImage.Tag }}
  # The chart writes this map sorted by name, and the kubelet expands
  # $(NAME) only from variables defined above: {{ .Names.RoutePasswordEnv }} sorts
  # before {{ .Names.RouteURLsEnv }}.
  env:
    COMPASS_CALLOUT_NATS_PASSWORD:
      valueFrom:
        secretKeyRef:
          name: {{ .Names.UsersSecret }}
          key: callout-password
    COMPASS_KICK_NATS_PASSWORD:
      valueFrom:
        secretKeyRef:
          name: {{ .Names.UsersSecret }}
          key: kick-password
    COMPASS_SERVER_NATS_PASSWORD:
      valueFrom:
        secretKeyRef:
          name: {{ .Names.UsersSecret }}
          key: server-password
{{- if .NATSClustered }}
    {{ .Names.RoutePasswordEnv }}:
      valueFrom:
        secretKeyRef:
          name: {{ .Names.RouteSecret }}
          key: password
    {{ .Names.RouteURLsEnv }}: {{ quote .NATSRouteURLs }}
{{- end }}
{{ end }}
