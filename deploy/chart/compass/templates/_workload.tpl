{{- /*
The operator's values no flag of manifests sets: labels and annotations on
every object, and per workload its pods' labels, annotations, scheduling,
resources and pull settings. The view (templates/_view.tpl) gathers each
workload's into .Pods.<Runner|Callout|NATS|Server|Backup|Migrate>; the
templates print them with the defines below, every one printing nothing
when its value is empty, so a rendering without these values is the one
the flags alone give.
*/ -}}

{{- /* compass.checkMetadata: the keys commonLabels, commonAnnotations and
the podLabels and podAnnotations may not set. The chart's labels are what its
selectors, Services, NetworkPolicies, PodDisruptionBudgets and monitors
select by: a value that could set app.kubernetes.io/name on a pod could make
that pod the Server's, receiving the door's traffic, or the callout's,
reaching NATS through its NetworkPolicy, and one on the Namespaces could
relax their restricted Pod Security level. So a collision is refused, naming
the value, rather than either side silently winning. */}}
{{- define "compass.checkMetadata" }}
{{- $V := .Values }}
{{- $chartLabels := list "app.kubernetes.io/name" "app.kubernetes.io/part-of" "app.kubernetes.io/component" "grafana_dashboard" "kubernetes.io/metadata.name" }}
{{- $labels := list (list "commonLabels" $V.commonLabels) }}
{{- $annotations := list (list "commonAnnotations" $V.commonAnnotations) }}
{{- range $w := list "runner" "callout" "nats" "server" }}
{{- $labels = append $labels (list (printf "%s.podLabels" $w) (index $V $w).podLabels) }}
{{- $annotations = append $annotations (list (printf "%s.podAnnotations" $w) (index $V $w).podAnnotations) }}
{{- end }}
{{- range $l := $labels }}
{{- range $k, $x := index $l 1 }}
{{- if or (has $k $chartLabels) (hasPrefix "compass-runner.io/" $k) (hasPrefix "pod-security.kubernetes.io/" $k) }}
{{- fail (printf "%s: %s is a label the chart sets itself (selectors and the namespaces' Pod Security level read it): use another key" (index $l 0) $k) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $k, $x := $V.commonLabels }}
{{- if hasKey ($V.monitoring.labels | default dict) $k }}
{{- fail (printf "commonLabels: %s is also a monitoring label (monitoring.labels, --monitoring-label): set it in one place" $k) }}
{{- end }}
{{- end }}
{{- range $a := $annotations }}
{{- range $k, $x := index $a 1 }}
{{- if hasPrefix "compass-runner.io/" $k }}
{{- fail (printf "%s: %s is an annotation the chart sets itself: use another key" (index $a 0) $k) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- /* compass.pairs: (list n map), each key: value of the map on a line of
its own indented by n, keys sorted, both quoted (a label's value is a
string even when the values file wrote a number). */}}
{{- define "compass.pairs" }}
{{- $n := index . 0 }}
{{- range $k, $val := index . 1 }}
{{ indent $n (printf "%s: %s" (quote $k) (quote $val)) }}
{{- end }}
{{- end }}

{{- /* compass.annotations: (list n map), an annotations: block at indent n
holding the map, nothing when it is empty. */}}
{{- define "compass.annotations" }}
{{- if index . 1 }}
{{ indent (index . 0) "annotations:" }}
{{- include "compass.pairs" (list (int (add (index . 0) 2)) (index . 1)) }}
{{- end }}
{{- end }}

{{- /* compass.resources: (list n resources), a container's resources:
block at indent n. requests come first, as the chart always wrote them; an
empty value (resources: {} or null) sets none. */}}
{{- define "compass.resources" }}
{{- $n := index . 0 }}
{{- $r := index . 1 }}
{{- if not $r }}
{{ indent $n "resources: {}" }}
{{- else }}
{{ indent $n "resources:" }}
{{- with $r.requests }}
{{ indent (int (add $n 2)) "requests:" }}
{{- toYaml . | nindent (int (add $n 4)) }}
{{- end }}
{{- with omit $r "requests" }}
{{- toYaml . | nindent (int (add $n 2)) }}
{{- end }}
{{- end }}
{{- end }}

{{- /* compass.imagePullPolicy: (list n pod), a container's imagePullPolicy
at indent n; empty: the Kubernetes default (IfNotPresent, Always for an
image tagged latest or not at all). */}}
{{- define "compass.imagePullPolicy" }}
{{- with (index . 1).ImagePullPolicy }}
{{ indent (index $ 0) (printf "imagePullPolicy: %s" (quote .)) }}
{{- end }}
{{- end }}

{{- /* compass.pod-scheduling: (list n pod), at a pod spec's indent n: its
priorityClassName, nodeSelector, tolerations and imagePullSecrets. The
affinity is printed by each template, beside the chart's own terms. */}}
{{- define "compass.pod-scheduling" }}
{{- $n := index . 0 }}
{{- $p := index . 1 }}
{{- with $p.PriorityClassName }}
{{ indent $n (printf "priorityClassName: %s" (quote .)) }}
{{- end }}
{{- with $p.NodeSelector }}
{{ indent $n "nodeSelector:" }}
{{- toYaml . | nindent (int (add $n 2)) }}
{{- end }}
{{- with $p.Tolerations }}
{{ indent $n "tolerations:" }}
{{- toYaml . | nindent (int (add $n 2)) }}
{{- end }}
{{- with $p.ImagePullSecrets }}
{{ indent $n "imagePullSecrets:" }}
{{- range . }}
{{ indent (int (add $n 2)) (printf "- name: %s" (quote .)) }}
{{- end }}
{{- end }}
{{- end }}

{{- /* compass.pod-affinity: (list n pod), the values' affinity terms at
indent n + 2, under an affinity: key the caller prints. */}}
{{- define "compass.pod-affinity" }}
{{- with (index . 1).Affinity }}
{{- toYaml . | nindent (int (add (index $ 0) 2)) }}
{{- end }}
{{- end }}
