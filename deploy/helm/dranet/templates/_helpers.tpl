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

{{/* dranet's --bind-address: bindAddress, or :<metricsPort> (every interface). */}}
{{- define "dranet.bindAddress" -}}
{{- .Values.bindAddress | default (printf ":%v" .Values.metricsPort) -}}
{{- end -}}

{{/* The port of the bind address (what the probes, the container port and the Service use). */}}
{{- define "dranet.bindPort" -}}
{{- $port := regexReplaceAll "^.*:" (include "dranet.bindAddress" .) "" | int -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "bindAddress %q: the port must be 1-65535" (include "dranet.bindAddress" .)) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/* The host the probes connect to: empty (the pod IP, which is the node's with hostNetwork) when
dranet listens on every interface, else the one address it listens on, without brackets.
kubelet connects from the node's network namespace, the pod's own with hostNetwork, so a
loopback address works too. */}}
{{- define "dranet.probeHost" -}}
{{- $host := regexReplaceAll ":[0-9]+$" (include "dranet.bindAddress" .) "" | trimPrefix "[" | trimSuffix "]" -}}
{{- if not (has $host (list "" "0.0.0.0" "::")) -}}
{{- $host -}}
{{- end -}}
{{- end -}}

{{/* Whether the bind address is a loopback one (not reachable from Prometheus). */}}
{{- define "dranet.loopback" -}}
{{- $host := include "dranet.probeHost" . -}}
{{- if or (eq $host "localhost") (eq $host "::1") (hasPrefix "127." $host) -}}
true
{{- end -}}
{{- end -}}

{{/* One probe's httpGet on the bind address: call with (dict "root" $ "path" "/healthz"). */}}
{{- define "dranet.probeGet" -}}
httpGet:
  path: {{ .path }}
  port: {{ include "dranet.bindPort" .root }}
  {{- with include "dranet.probeHost" .root }}
  host: {{ . | quote }}
  {{- end }}
{{- end -}}

{{/* The DeviceClass this release may render: none when a class of that name exists and another
owner (a person, another release) has it. `lookup` finds nothing under `helm template`. */}}
{{- define "dranet.deviceClassOurs" -}}
{{- $existing := lookup "resource.k8s.io/v1" "DeviceClass" "" .Values.driverName -}}
{{- if not $existing -}}
true
{{- else if and (eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $existing) .Release.Name) (eq (dig "metadata" "annotations" "meta.helm.sh/release-namespace" "" $existing) .Release.Namespace) -}}
true
{{- end -}}
{{- end -}}
