{{- define "compass.server-database-env" }}
{{- if .ServerSQLite }}
            - name: COMPASS_DATA_DIR
              value: {{ .Server.DataDir }}
{{- else }}
            - name: COMPASS_DATABASE_URL
              valueFrom:
                secretKeyRef:
                  name: {{ quote .ServerDatabaseSecret }}
                  key: url
{{- end }}
{{- end }}

{{- define "compass.server-container-security" }}
          securityContext:
            runAsNonRoot: true
            readOnlyRootFilesystem: true
            allowPrivilegeEscalation: false
            capabilities:
              drop: [ALL]
            seccompProfile:
              type: RuntimeDefault
{{- end }}
