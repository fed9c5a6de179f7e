{{- /* The nats-server pod template, for the single server's Deployment and the cluster's StatefulSet. */ -}}
{{- define "compass.nats-pod" }}
    metadata:
      labels:
        app.kubernetes.io/name: nats
        app.kubernetes.io/part-of: compass
{{- include "compass.pairs" (list 8 .Pods.NATS.Labels) }}
{{- include "compass.annotations" (list 6 .Pods.NATS.Annotations) }}
    spec:
      automountServiceAccountToken: false
      enableServiceLinks: false
{{- include "compass.pod-scheduling" (list 6 .Pods.NATS) }}
      # Lame duck on termination (preStop below) takes lame_duck_duration
      # ({{ .NATS.LameDuckDuration }}); this leaves it room before the kubelet's SIGKILL.
      terminationGracePeriodSeconds: {{ .NATS.TerminationGraceSeconds }}
      # The reloader container signals nats-server (SIGHUP through
      # nats-server --signal reload): they share the pod's process
      # namespace, both as the same user. Nothing else runs in the pod.
      shareProcessNamespace: true
{{- if or .Pods.NATS.Affinity .Pods.NATS.Spread }}
      affinity:
{{- include "compass.pod-affinity" (list 6 .Pods.NATS) }}
{{- end }}
{{- if .Pods.NATS.Spread }}
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    app.kubernetes.io/name: nats
{{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        fsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: nats
          image: {{ quote .NATSImage }}
{{- include "compass.imagePullPolicy" (list 10 .Pods.NATS) }}
          # --pid: the pid file the preStop hook (lame duck) and the reloader
          # signal through, on the pod's own emptyDir.
          args: ["--config", "{{ .NATS.ConfigDir }}/nats.conf", "--pid", "{{ .NATS.PIDFile }}"]
{{- if or (not .OperatorMode) .NATSClustered }}
          env:
{{- end }}
{{- if not .OperatorMode }}
            - name: COMPASS_CALLOUT_NATS_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{ .Names.UsersSecret }}
                  key: callout-password
            - name: COMPASS_SERVER_NATS_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{ .Names.UsersSecret }}
                  key: server-password
            # compass-callout's kick identity, the system account's only user.
            - name: COMPASS_KICK_NATS_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{ .Names.UsersSecret }}
                  key: kick-password
{{- end }}
{{- if .NATSGateway }}
            - name: {{ .Names.PodNameEnv }}
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            # <pod>.<gateway>: unique in the whole supercluster.
            - name: {{ .Names.ServerNameEnv }}
              value: {{ quote .NATSServerNameValue }}
{{- else if .NATSClustered }}
            - name: {{ .Names.ServerNameEnv }}
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
{{- end }}
{{- if .NATSClustered }}
            - name: {{ .Names.RoutePasswordEnv }}
              valueFrom:
                secretKeyRef:
                  name: {{ .Names.RouteSecret }}
                  key: password
            # Defined after {{ .Names.RoutePasswordEnv }}: the kubelet expands $(NAME) from
            # the variables above it. The pod spec keeps the reference, never the password.
            - name: {{ .Names.RouteURLsEnv }}
              value: {{ quote .NATSRouteURLs }}
{{- end }}
{{- if .NATSGateway }}
            # The gateway password, the same in every region of the supercluster.
            - name: {{ .Names.GatewayPasswordEnv }}
              valueFrom:
                secretKeyRef:
                  name: {{ .Names.GatewaySecret }}
                  key: password
{{- end }}
          ports:
            - name: client
              containerPort: {{ .Names.ClientPort }}
              protocol: TCP
{{- if .NATSClustered }}
            - name: cluster
              containerPort: {{ .Names.RoutePort }}
              protocol: TCP
{{- end }}
{{- if .NATSGateway }}
            - name: gateway
              containerPort: {{ .NATSGatewayPort }}
              protocol: TCP
{{- end }}
{{- if eq .NATSMonitor "pod" }}
            - name: monitor
              containerPort: {{ .Names.MonitorPort }}
              protocol: TCP
{{- end }}
          # A TCP probe of the client port: the monitoring endpoint is on
          # loopback (or off) unless asked for, and nats-server logs a probe's
          # unfinished TLS handshake at debug level only.
          livenessProbe:
            tcpSocket:
              port: client
            periodSeconds: 10
          readinessProbe:
            tcpSocket:
              port: client
            periodSeconds: 5
          # Lame duck mode on termination: nats-server stops accepting
          # clients, then closes its connections spread over
          # lame_duck_duration, so a rolling restart hands its Runners to the
          # other servers a few at a time instead of all at once (each
          # reconnect is an authorization the callout must answer). It
          # ignores the kubelet's SIGTERM while in lame duck mode and exits
          # when done. The image must have nats-server on its PATH (the
          # -alpine images do).
          lifecycle:
            preStop:
              exec:
                command: ["nats-server", "--signal", "ldm={{ .NATS.PIDFile }}"]
{{- include "compass.resources" (list 10 .Pods.NATS.Resources) }}
          securityContext:
            runAsNonRoot: true
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities:
              drop: [ALL]
            seccompProfile:
              type: RuntimeDefault
          # Directories, never subPath (which the kubelet never updates): a
          # renewed certificate Secret or an edited configuration reaches
          # these files, and the reloader has nats-server reload them.
          volumeMounts:
{{- template "compass.nats-mounts" . }}
            - name: run
              mountPath: {{ .NATS.RunDir }}
        # The reloader: when the configuration or a certificate changes on
        # disk, it asks nats-server to reload (nats-server --signal reload:
        # the new certificate is served to new connections, live ones stay).
        # It is the nats image's own shell and nats-server binary, so the pod
        # pulls nothing else (docs/designs/DECISIONS.md, DL-454).
        - name: reloader
          image: {{ quote .NATSImage }}
{{- include "compass.imagePullPolicy" (list 10 .Pods.NATS) }}
          command: ["sh", "-c", {{ quote .NATS.ReloaderScript }}, "reloader"{{ range .NATS.WatchedFiles }}, {{ quote . }}{{ end }}]
          env:
            - name: COMPASS_NATS_PID_FILE
              value: {{ .NATS.PIDFile }}
            - name: COMPASS_NATS_RELOAD_EVERY
              value: "{{ .NATS.ReloadEverySeconds }}"
{{- include "compass.resources" (list 10 .Pods.NATS.ReloaderResources) }}
          securityContext:
            runAsNonRoot: true
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities:
              drop: [ALL]
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
{{- template "compass.nats-mounts" . }}
            - name: run
              mountPath: {{ .NATS.RunDir }}
              readOnly: true
      volumes:
        # nats-server's pid file, for the preStop hook and the reloader.
        - name: run
          emptyDir:
            sizeLimit: 1Mi
        - name: config
          configMap:
            name: compass-nats-config
        - name: tls
          secret:
            secretName: {{ quote .NATSTLSSecret }}
            defaultMode: 288                # 0440
{{- if .NATSClustered }}
        - name: route-tls
          secret:
            secretName: {{ quote .NATSRouteTLSSecret }}
            defaultMode: 288                # 0440
{{- end }}
{{- if .NATSGateway }}
        - name: gateway-tls
          secret:
            secretName: {{ quote .NATSGatewayTLSSecret }}
            defaultMode: 288                # 0440
{{- end }}
{{- end }}

{{- define "compass.nats-mounts" }}
            - name: config
              mountPath: {{ .NATS.ConfigDir }}
              readOnly: true
            - name: tls
              mountPath: {{ .Names.TLSDir }}
              readOnly: true
{{- if .NATSClustered }}
            - name: route-tls
              mountPath: {{ .Names.RouteTLSDir }}
              readOnly: true
{{- end }}
{{- if .NATSGateway }}
            - name: gateway-tls
              mountPath: {{ .Names.GatewayTLSDir }}
              readOnly: true
{{- end }}
{{- end }}

{{- /* The reloader container's program (sh -c, the nats image's busybox):
every $COMPASS_NATS_RELOAD_EVERY seconds it hashes the watched files (its
arguments) and, when they changed, sends nats-server the reload signal
through its pid file. A failed signal (nats-server not up yet) is tried
again on the next round. A configuration nats-server cannot reload is
refused by nats-server itself, which logs why and keeps the one it runs. */}}
{{- define "compass.natsReloaderScript" -}}
set -u
sum() { cat "$@" 2>/dev/null | md5sum; }
last=$(sum "$@")
echo "reloader: watching $# files every ${COMPASS_NATS_RELOAD_EVERY}s"
while sleep "$COMPASS_NATS_RELOAD_EVERY"; do
  now=$(sum "$@")
  [ "$now" = "$last" ] && continue
  if nats-server --signal "reload=$COMPASS_NATS_PID_FILE"; then
    echo "reloader: the configuration or a certificate changed: nats-server reloads"
    last=$now
  fi
done
{{- end }}
