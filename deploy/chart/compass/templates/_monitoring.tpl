{{- define "compass.monitoring-labels" }}
{{- range .MonitoringLabelList }}
    {{ quote .Key }}: {{ quote .Value }}
{{- end }}
{{- end }}
