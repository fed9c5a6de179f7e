{{- define "compass.metrics-ingress" }}
    # Prometheus, from the metrics namespace.
    - ports:
        - port: {{ .Server.MetricsPort }}
          protocol: TCP
      from:
        - namespaceSelector:
            matchLabels:
              kubernetes.io/metadata.name: {{ quote .MetricsNamespace }}
{{- end }}

{{- define "compass.dns-egress" }}
    # DNS: the cluster's resolver in kube-system.
    - ports:
        - port: 53
          protocol: UDP
        - port: 53
          protocol: TCP
      to:
        - namespaceSelector:
            matchLabels:
              kubernetes.io/metadata.name: kube-system
{{- end }}

{{- define "compass.component-egress" }}
{{- template "compass.dns-egress" . }}
{{- if .NATSImage }}
    # NATS: the in-cluster nats-server.
    - ports:
        - port: {{ .Names.ClientPort }}
          protocol: TCP
      to:
        - podSelector:
            matchLabels:
              app.kubernetes.io/name: nats
{{- else }}
    # NATS run outside this rendering: the ports of the NATS URLs.
    - ports:
{{- range .NATSURLPorts }}
        - port: {{ . }}
          protocol: TCP
{{- end }}
{{- template "compass.cidrs-to" .NATSCIDRs }}
{{- end }}
{{- if .DatabaseCIDR }}
    # PostgreSQL.
    - ports:
        - port: {{ .DatabasePort }}
          protocol: TCP
      to:
        - ipBlock:
            cidr: {{ quote .DatabaseCIDR }}
{{- end }}
    # The issuers' discovery documents and JWKS.
    - ports:
        - port: {{ .Server.IssuerPort }}
          protocol: TCP
      to:
{{- range .IssuerCIDRs }}
        - ipBlock:
            cidr: {{ quote . }}
{{- end }}
{{- if .TokenReview }}
    # This cluster's API server, for the TokenReview of Runner tokens
    # (tokenReview.enabled): its endpoints' addresses, after the Service's
    # translation, which is what a NetworkPolicy sees.
    - ports:
        - port: 443
          protocol: TCP
        - port: 6443
          protocol: TCP
{{- template "compass.cidrs-to" .APIServerCIDRs }}
{{- end }}
{{- end }}

{{- /* compass.cidrs-to: a rule's destinations, the CIDRs given; none: any address. */}}
{{- define "compass.cidrs-to" }}
{{- if . }}
      to:
{{- range . }}
        - ipBlock:
            cidr: {{ quote . }}
{{- end }}
{{- end }}
{{- end }}
