{{- define "compass.natsConfig" -}}
{{- if .OperatorMode -}}
# nats-server configuration for compass-callout: operator mode. Rendered by
# `compass-server manifests`. The accounts, their users and the callout's
# keys are an operator's JWTs (deploy/nats/README.md), given as the values
# nats.operator.resolver and nats.operator.sentinel; none of it is secret.
{{- else -}}
# nats-server configuration for compass-callout: server-config mode with xkey.
# Rendered by `compass-server manifests`. The public keys are not secret:
#   issuer: the public account nkey (A...) of the callout's signing seed
#           (nk -gen account -pubout, or nsc generate nkey --account);
#   xkey:   the public curve key (X...) of the callout's xkey seed
#           (nk -gen curve -pubout, or nsc generate nkey --curve).
# The passwords come from the environment (COMPASS_CALLOUT_NATS_PASSWORD,
# COMPASS_SERVER_NATS_PASSWORD, COMPASS_KICK_NATS_PASSWORD{{ if .NATSClustered }},
# {{ .Names.RoutePasswordEnv }}{{ end }}{{ if .NATSGateway }}, {{ .Names.GatewayPasswordEnv }}{{ end }}); never write them into this file.
{{- end }}
port: {{ .Names.ClientPort }}
# Lame duck mode (the pod's preStop): no new clients; after
# lame_duck_grace_period the clients are closed spread over the rest of
# lame_duck_duration, so they reconnect to the other servers a few at a time
# instead of all at once.
lame_duck_grace_period: "{{ .NATS.LameDuckGrace }}"
lame_duck_duration: "{{ .NATS.LameDuckDuration }}"
{{- if .NATSGateway }}
# Each server is named after its pod (the downward API's metadata.name) and
# this region's gateway, <pod>.{{ .NATSGatewayName }}: a server name is unique in the
# whole supercluster, and every region's pods are nats-0, nats-1, ...
server_name: ${{ .Names.ServerNameEnv }}
{{- else if .NATSClustered }}
# Each server is named after its pod (the downward API's metadata.name).
server_name: ${{ .Names.ServerNameEnv }}
{{- end }}
{{- if .NATSMonitorListen }}
# Monitoring (/varz, /connz, /healthz) has no authentication, and /connz
# lists every connection with its user (a Runner ID) and address.
http: "{{ .NATSMonitorListen }}"
{{- else }}
# No monitoring endpoint.
{{- end }}

# Clients connect over TLS only: a Runner's CONNECT carries its token, which
# the door accepts until its exp plus the leeway, so anyone on the path who
# read it could use it. The certificate is Secret {{ .NATSTLSSecret }}, mounted here;
# its SANs cover the hosts of the NATS URLs.
tls {
  cert_file: "{{ .Names.TLSDir }}/tls.crt"
  key_file: "{{ .Names.TLSDir }}/tls.key"
  timeout: 3
}

{{ if .OperatorMode -}}
{{ if .NATSClustered -}}
# Every server of the cluster has these same JWTs: a Runner connecting to any
# server is authorized by a callout connected to any other, the request
# travelling in AUTH over the routes.
{{ end -}}
# The operator, the system account and the account JWTs (SYS, AUTH with its
# authorization block: the callout's user, the RUNNERS account it may place
# users in, and the xkey; RUNNERS), as nsc generate config --mem-resolver
# writes them. The callout's own user, compass-server and the kick identity
# authenticate with their own user JWTs. A change of these JWTs (a rotation
# of the callout's keys) reaches a running server by a configuration reload.

{{ .NATSOperatorResolver | trim }}

# A Runner presents only its token, no NATS JWT: the server then makes it
# this deny-all bearer user of AUTH, which sends its CONNECT to the callout.
default_sentinel: {{ .NATSSentinel | trim }}

authorization {
  # How long the server waits for the callout's answer. A nats.go client
  # (compass-runner) gives up at about 2 s whatever this is (nats-server's
  # first PING); the callout answers within 1.8 s or not at all.
  timeout: {{ .AuthTimeoutSeconds }}
}
{{- else -}}
{{ if .NATSClustered -}}
# Every server of the cluster has these same accounts, system account and
# auth_callout block: a Runner connecting to any server is authorized by a
# callout connected to any other, the request travelling in AUTH over the
# routes, and the system account's events reach every server.
{{ end -}}
accounts {
  # The callout's own account: it subscribes to $SYS.REQ.USER.AUTH here.
  AUTH {
    users: [
      { user: "compass-callout", password: $COMPASS_CALLOUT_NATS_PASSWORD }
    ]
  }
  # Runners land here with the user JWT the callout issues; the Server talks to them here.
  {{ .NATSAccount }} {
    users: [
      { user: "compass-server", password: $COMPASS_SERVER_NATS_PASSWORD }
    ]
  }
  # The system account has one user: compass-callout's kick identity. When
  # a node is denied, a cluster removed or a minted token revoked, the
  # callout lists the live connections ($SYS.REQ.SERVER.PING.CONNZ, then
  # $SYS.REQ.SERVER.<id>.CONNZ for further pages) and ends the Runner's
  # ($SYS.REQ.SERVER.<id>.KICK), so a denied node's live connection ends
  # within seconds rather than when its user JWT expires. It follows the
  # Runners' account's connect and disconnect events, so that a duplicate
  # check asks no server when they show no older connection. This user can
  # list connections and end them, and nothing else: no other system
  # request (no reload, no lame-duck mode, no server or account statistics),
  # no subscription but its own reply inboxes and those two events, and
  # nothing outside SYS.
  SYS {
    users: [
      {
        user: "compass-kick", password: $COMPASS_KICK_NATS_PASSWORD
        permissions: {
          publish: { allow: [ "$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.*.CONNZ", "$SYS.REQ.SERVER.*.KICK" ] }
          subscribe: { allow: [ "_INBOX.>", "$SYS.ACCOUNT.{{ .NATSAccount }}.CONNECT", "$SYS.ACCOUNT.{{ .NATSAccount }}.DISCONNECT" ] }
        }
      }
    ]
  }
}
system_account: SYS

authorization {
  # How long the server waits for the callout's answer. A nats.go client
  # (compass-runner) gives up at about 2 s whatever this is (nats-server's
  # first PING); the callout answers within 1.8 s or not at all.
  timeout: {{ .AuthTimeoutSeconds }}
  auth_callout {
    issuer: {{ .NATSCalloutIssuer }}
    # These users authenticate with their passwords and skip the callout
    # (compass-kick too: its CONNECT would otherwise go to the callout, which
    # accepts Runner tokens only).
    auth_users: [ "compass-callout", "compass-server", "compass-kick" ]
    account: AUTH
    xkey: {{ .NATSCalloutXKey }}
  }
}
{{- end }}
{{- if .NATSClustered }}

cluster {
{{- if .NATSGateway }}
  # The gateway's name: nats-server requires the two to be the same.
{{- end }}
  name: {{ .NATSClusterName }}
  listen: "0.0.0.0:{{ .Names.RoutePort }}"
  # Servers tell their clients every server's address (INFO connect_urls, the
  # pods' IPs): a client learns the whole cluster from the nats Service and
  # reconnects to a survivor when its server goes. Reachable inside this
  # Kubernetes cluster; a client outside it falls back to its own URLs.
  no_advertise: false
  # Routes are mutual TLS: every server presents the certificate of Secret
  # {{ .NATSRouteTLSSecret }} (*.{{ .Names.Headless }}.{{ .CalloutNamespace }}.svc, serverAuth and
  # clientAuth) and verifies its peer's against ca.crt.
  tls {
    cert_file: "{{ .Names.RouteTLSDir }}/tls.crt"
    key_file: "{{ .Names.RouteTLSDir }}/tls.key"
    ca_file: "{{ .Names.RouteTLSDir }}/ca.crt"
    verify: true
    timeout: 3
  }
  # And every route authenticates as {{ .Names.RouteUser }}, its password from Secret
  # {{ .Names.RouteSecret }} in the environment.
  authorization {
    user: "{{ .Names.RouteUser }}"
    password: ${{ .Names.RoutePasswordEnv }}
    timeout: 3
  }
  # Every server, itself included (nats-server skips a route to itself), by
  # its stable DNS name:
{{- range .NATSPeers }}
  #   {{ . }}
{{- end }}
  # nats-server sends a route's credentials from its URL only, so the URLs
  # (tls://{{ .Names.RouteUser }}:<password>@<peer>) are built in the pod's environment,
  # {{ .Names.RouteURLsEnv }}, from {{ .Names.RoutePasswordEnv }}.
  routes: ${{ .Names.RouteURLsEnv }}
}
{{- end }}
{{- if .NATSGateway }}

# This region's gateway to the other regions of the supercluster: every
# server accepts their gateway connections on port {{ .NATSGatewayPort }} and dials each
# region listed below (one connection to every other region from every
# server). Accounts, the system account included, span the supercluster.
gateway {
  name: "{{ .NATSGatewayName }}"
  listen: "0.0.0.0:{{ .NATSGatewayPort }}"
{{- if .NATSGatewayAdvertise }}
  # What every server tells the other regions to dial, instead of its pod's
  # address: where they reach this region's gateway.
  advertise: "{{ .NATSGatewayAdvertise }}"
{{- end }}
  # Only the regions listed below may connect: a gateway of any other name
  # is refused, whatever certificate and password it has.
  reject_unknown_cluster: true
  # Gateways are mutual TLS, both ways: every server presents the
  # certificate of Secret {{ .NATSGatewayTLSSecret }} (serverAuth and clientAuth; its SANs
  # cover the hosts the other regions dial) and verifies the other region's
  # against ca.crt, the supercluster's gateway CA. There is no plaintext
  # gateway: a nats:// URL below is dialled with TLS too.
  tls {
    cert_file: "{{ .Names.GatewayTLSDir }}/tls.crt"
    key_file: "{{ .Names.GatewayTLSDir }}/tls.key"
    ca_file: "{{ .Names.GatewayTLSDir }}/ca.crt"
    verify: true
    timeout: 3
  }
  # And every gateway connection authenticates as {{ .Names.GatewayUser }}, with the
  # password of Secret {{ .Names.GatewaySecret }} (the same in every region) in the
  # environment: nats-server checks it on the connections it accepts and
  # sends it on those it dials, so the URLs below carry no credentials.
  authorization {
    user: "{{ .Names.GatewayUser }}"
    password: ${{ .Names.GatewayPasswordEnv }}
    timeout: 3
  }
  gateways: [
{{- range .NATSGatewayRemotes }}
    { name: "{{ .Name }}", urls: {{ .URLList }} }
{{- end }}
  ]
}
{{- end }}
{{ end }}
