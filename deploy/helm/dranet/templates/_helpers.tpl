{{/* The chart's name, or nameOverride. */}}
{{- define "dranet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride, or <release>-<name> (just <release> when it contains the name). */}}
{{- define "dranet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dranet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dranet.labels" -}}
helm.sh/chart: {{ include "dranet.chart" . }}
app.kubernetes.io/name: {{ include "dranet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Upstream's selector: a DaemonSet's selector is immutable, so an upgrade over an upstream install needs the same one. */}}
{{- define "dranet.selectorLabels" -}}
app: {{ include "dranet.name" . }}
{{- end -}}

{{- define "dranet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dranet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
