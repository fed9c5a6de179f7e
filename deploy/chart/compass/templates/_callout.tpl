{{- define "compass.callout-container" }}
        - name: callout
          image: {{ quote .CalloutImage }}
{{- include "compass.imagePullPolicy" (list 10 .Pods.Callout) }}
          env:
            - name: COMPASS_MODE
              value: {{ .CalloutMode }}
            - name: COMPASS_NATS_URL
              value: {{ quote .NATSURL }}
{{- if .OperatorMode }}
            # The callout's own user JWT (AUTH's auth_users), and the
            # callout account whose signing key signs the answers.
            - name: COMPASS_NATS_CREDS
              value: /var/run/secrets/compass/callout/nats/creds
            - name: COMPASS_CALLOUT_ACCOUNT
              value: {{ quote .CalloutAccount }}
            # The Runners' account's signing key, which signs their user JWTs.
            - name: COMPASS_USER_SIGNING_SEED_FILE
              value: /var/run/secrets/compass/callout/user-signing/seed
{{- if .CalloutNextUserSigning }}
            # A rotation in progress (callout.nextUserSigning): the next one too.
            - name: COMPASS_NEXT_USER_SIGNING_SEED_FILE
              value: /var/run/secrets/compass/callout/user-signing/next-seed
{{- end }}
{{- else }}
            - name: COMPASS_NATS_USER
              value: compass-callout
            - name: COMPASS_NATS_PASSWORD_FILE
              value: /var/run/secrets/compass/callout/nats/password
{{- end }}
            - name: COMPASS_ISSUER_SEED_FILE
              value: /var/run/secrets/compass/callout/signing/seed
            - name: COMPASS_XKEY_SEED_FILE
              value: /var/run/secrets/compass/callout/xkey/seed
{{- if .CalloutNextIssuer }}
            # A rotation in progress (callout.nextIssuer): the next issuer too.
            - name: COMPASS_NEXT_ISSUER_SEED_FILE
              value: /var/run/secrets/compass/callout/signing/next-seed
{{- end }}
{{- if .CalloutNextXKey }}
            # A rotation in progress (callout.nextXKey): the next xkey too.
            - name: COMPASS_NEXT_XKEY_SEED_FILE
              value: /var/run/secrets/compass/callout/xkey/next-seed
{{- end }}
            # The kick identity (docs/self-host.md, "The kick identity"): the
            # system account's user that lists connections and ends those of a
            # Runner the doors no longer accept, and may do nothing else.
{{- if .OperatorMode }}
            - name: COMPASS_KICK_CREDS
              value: /var/run/secrets/compass/callout/kick/creds
{{- else }}
            - name: COMPASS_KICK_USER
              value: compass-kick
            - name: COMPASS_KICK_PASSWORD_FILE
              value: /var/run/secrets/compass/callout/kick/password
{{- end }}
            - name: COMPASS_ACCOUNT
              value: {{ quote .NATSAccount }}
            - name: COMPASS_RUNNER_CLUSTERS
              value: /etc/compass/clusters/clusters.yaml
            # The metrics, health and readiness listener binds the pod's own
            # address explicitly, not the daemon's default (loopback, which
            # neither the kubelet's probes nor Prometheus reach).
            - name: {{ .Names.PodIPEnv }}
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: COMPASS_METRICS_ADDR
              value: "[$({{ .Names.PodIPEnv }})]:{{ .Callout.MetricsPort }}"
{{- if .CABundleConfigMap }}
            - name: COMPASS_NATS_CA_FILE
              value: /etc/compass/ca/ca.crt
{{- end }}
{{- template "compass.callout-database-env" . }}
          ports:
            - name: {{ .Callout.MetricsPortName }}
              containerPort: {{ .Callout.MetricsPort }}
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: {{ .Callout.MetricsPortName }}
            periodSeconds: 10
            timeoutSeconds: 2
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: {{ .Callout.MetricsPortName }}
            periodSeconds: 5
            timeoutSeconds: 2
            failureThreshold: 2
{{- include "compass.resources" (list 10 .Pods.Callout.Resources) }}
          securityContext:
            runAsNonRoot: true
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities:
              drop: [ALL]
            seccompProfile:
              type: RuntimeDefault
          volumeMounts:
            - name: callout-secrets
              mountPath: /var/run/secrets/compass/callout
              readOnly: true
            - name: runner-clusters
              mountPath: /etc/compass/clusters
              readOnly: true
{{- if .CABundleConfigMap }}
            - name: ca
              mountPath: /etc/compass/ca
              readOnly: true
{{- end }}
{{- if .CalloutInServerPod }}
            - name: data
              mountPath: {{ .Server.DataDir }}
{{- end }}
{{- template "compass.kube-api-mount" . }}
{{- end }}

{{- define "compass.callout-secrets-volume" }}
        # Secrets referenced by name, created out of band (docs/self-host.md,
        # "Deploying compass-callout").
        - name: callout-secrets
          projected:
            defaultMode: 288                # 0440: owner and fsGroup read
            sources:
              - secret:
                  name: compass-callout-signing
                  items:
                    - key: seed
                      path: signing/seed
{{- if .CalloutNextIssuer }}
                    - key: next-seed
                      path: signing/next-seed
{{- end }}
              - secret:
                  name: compass-callout-xkey
                  items:
                    - key: seed
                      path: xkey/seed
{{- if .CalloutNextXKey }}
                    - key: next-seed
                      path: xkey/next-seed
{{- end }}
{{- if .OperatorMode }}
              - secret:
                  name: compass-callout-user-signing
                  items:
                    - key: seed
                      path: user-signing/seed
{{- if .CalloutNextUserSigning }}
                    - key: next-seed
                      path: user-signing/next-seed
{{- end }}
              - secret:
                  name: compass-callout-nats
                  items:
                    - key: creds
                      path: nats/creds
                    - key: kick-creds
                      path: kick/creds
{{- else }}
              - secret:
                  name: compass-callout-nats
                  items:
                    - key: password
                      path: nats/password
                    - key: kick-password
                      path: kick/password
{{- end }}
{{- end }}

{{- define "compass.callout-database-env" }}
{{- if .CalloutInServerPod }}
            # The Server's SQLite file, on the volume this pod shares with it
            # (read beside the Server's writes: WAL).
            - name: COMPASS_DATABASE_URL
              value: "sqlite://{{ .Server.DataDir }}/compass.db"
{{- else if .ServerImage }}
            # The Server's PostgreSQL database: minted Runner tokens (through
            # a role granted only SELECT, when server.calloutDatabaseSecret).
            - name: COMPASS_DATABASE_URL
              valueFrom:
                secretKeyRef:
                  name: {{ quote .CalloutDatabaseSecret }}
                  key: url
{{- else }}
            - name: COMPASS_DATABASE_URL        # optional: minted Runner tokens
              valueFrom:
                secretKeyRef:
                  name: compass-callout-database
                  key: url
                  optional: true
{{- end }}
{{- end }}

{{- /* The doors' API token and the cluster's CA, for the cluster file's
tokenReview (tokenReview.enabled): a projected ServiceAccount token the
kubelet rotates, with the API server's default audience, and the CA every
namespace has as ConfigMap kube-root-ca.crt. */}}
{{- define "compass.kube-api-volume" }}
{{- if .TokenReview }}
        - name: kube-api
          projected:
            defaultMode: 288                # 0440: owner and fsGroup read
            sources:
              - serviceAccountToken:
                  path: token
                  expirationSeconds: {{ .KubeAPI.TokenSeconds }}
              - configMap:
                  name: kube-root-ca.crt
                  items:
                    - key: ca.crt
                      path: ca.crt
{{- end }}
{{- end }}

{{- define "compass.kube-api-mount" }}
{{- if .TokenReview }}
            - name: kube-api
              mountPath: {{ .KubeAPI.Dir }}
              readOnly: true
{{- end }}
{{- end }}
