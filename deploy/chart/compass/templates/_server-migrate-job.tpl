{{- /*
The Server's migrate Job: the deliberate step of an upgrade (docs/store.md,
one migration policy). It is rendered alone, by compass-server manifests
--migrate-job, and applied by an operator after a backup, never by the apply
that rolls the Servers: the Server pod's init container only checks the
schema (check-schema) and refuses a mismatch, so no new image migrates as a
side effect of starting.
*/ -}}
{{- define "compass.server-migrate-job" }}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Server.MigrateJob }}
  namespace: {{ quote .CalloutNamespace }}
  labels:
    app.kubernetes.io/name: {{ .Server.MigrateJob }}
    app.kubernetes.io/part-of: compass
{{- include "compass.pairs" (list 4 .CommonLabels) }}
{{- include "compass.annotations" (list 2 .CommonAnnotations) }}
spec:
  # A failed migration is read and fixed by a person, not retried: it ran in
  # one transaction, so it left the schema as it was.
  backoffLimit: 0
  ttlSecondsAfterFinished: 86400
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {{ .Server.MigrateJob }}
        app.kubernetes.io/part-of: compass
{{- include "compass.pairs" (list 8 .Pods.Migrate.Labels) }}
    spec:
      restartPolicy: Never
      serviceAccountName: {{ .Server.Name }}
      automountServiceAccountToken: false
      enableServiceLinks: false
{{- include "compass.pod-scheduling" (list 6 .Pods.Migrate) }}
{{- if and .Pods.Migrate.Affinity (not .ServerSQLite) }}
      affinity:
{{- include "compass.pod-affinity" (list 6 .Pods.Migrate) }}
{{- end }}
{{- if .ServerSQLite }}
      # The database is a file on the Server's ReadWriteOnce claim, which only
      # pods on the node that holds it can mount: run there, beside the
      # Server (SQLite serializes the migration with its writes).
      affinity:
{{- include "compass.pod-affinity" (list 6 .Pods.Migrate) }}
        podAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    app.kubernetes.io/name: {{ .Server.Name }}
{{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        fsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: migrate
          image: {{ quote .ServerImage }}
{{- include "compass.imagePullPolicy" (list 10 .Pods.Migrate) }}
          args: ["migrate"]
          env:
{{- template "compass.server-database-env" . }}
          resources:
            requests:
              cpu: 50m
              memory: 32Mi
            limits:
              memory: 128Mi
{{- template "compass.server-container-security" . }}
{{- if .ServerSQLite }}
          volumeMounts:
            - name: data
              mountPath: {{ .Server.DataDir }}
      volumes:
        - name: data
          persistentVolumeClaim:
            claimName: data-{{ .Server.Name }}-0
{{- end }}
{{- end }}
