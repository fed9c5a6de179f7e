{{- /* compass.validate: the rules over several values, which
values.schema.json cannot state; each fails naming the value. */}}
{{- define "compass.validate" }}
{{- end }}
