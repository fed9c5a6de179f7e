{{- /* The CA of the Server's and NATS's certificates given as PEM
(caBundle): ConfigMap compass-ca, key ca.crt, in namespace .ns, right after
that namespace, so nothing has to exist before the install. Called with
(dict "v" $view "ns" namespace). */}}
{{- define "compass.ca-bundle" }}
{{- if .v.CABundle }}
---
# The CA of the Server's and NATS's certificates (caBundle), where the
# Runner and the callout mount it (/etc/compass/ca/ca.crt).
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ quote .v.CABundleConfigMap }}
  namespace: {{ quote .ns }}
  labels:
    app.kubernetes.io/part-of: compass
{{- include "compass.pairs" (list 4 .v.CommonLabels) }}
{{- include "compass.annotations" (list 2 .v.CommonAnnotations) }}
data:
  ca.crt: {{ quote .v.CABundle }}
{{- end }}
{{- end }}
