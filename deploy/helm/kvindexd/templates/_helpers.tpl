{{/* Chart name, truncated to the 63 characters Kubernetes names allow. */}}
{{- define "kvindexd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: <release>-kvindexd unless the release already says kvindexd. */}}
{{- define "kvindexd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvindexd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvindexd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvindexd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvindexd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: kv-indexer
{{- end }}

{{- define "kvindexd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvindexd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaces discovery watches: the release namespace by default; "*" = all. */}}
{{- define "kvindexd.discoveryNamespaces" -}}
{{- if .Values.discovery.namespaces }}
{{- join "," .Values.discovery.namespaces }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{- define "kvindexd.allNamespaces" -}}
{{- if has "*" .Values.discovery.namespaces }}true{{ end }}
{{- end }}

{{/* The discovery selector ("k=v,k2=v2") as matchLabels, for the NetworkPolicy. */}}
{{- define "kvindexd.engineMatchLabels" -}}
{{- range $term := splitList "," .Values.discovery.selector }}
{{- $kv := splitList "=" (trim $term) }}
{{- if ne (len $kv) 2 }}
{{- fail (printf "networkPolicy: discovery.selector term %q is not key=value: set networkPolicy.enginePodSelector" $term) }}
{{- end }}
{{ trim (index $kv 0) }}: {{ trim (index $kv 1) | quote }}
{{- end }}
{{- end }}

{{- define "kvindexd.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/* The Secret and key holding the Redis index URL, when one is configured. */}}
{{- define "kvindexd.redisSecret" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecret }}{{ else if .Values.redis.url }}{{ include "kvindexd.fullname" . }}-redis{{ end }}
{{- end }}

{{/*
Peer recovery is on for more than one replica of the in-memory index
(a shared Redis index needs no copy): "true" or "".
*/}}
{{- define "kvindexd.peerRecovery" -}}
{{- if and .Values.peerRecovery.enabled (gt (int .Values.replicaCount) 1) (not (include "kvindexd.redisSecret" .)) }}true{{ end }}
{{- end }}

{{/* The Secret holding the replicas' shared peer token. */}}
{{- define "kvindexd.peerSecret" -}}
{{- .Values.peerRecovery.existingSecret | default (printf "%s-peer" (include "kvindexd.fullname" .)) }}
{{- end }}

{{/* The workload's pod selector as a label selector string (--peer-selector). */}}
{{- define "kvindexd.peerSelector" -}}
{{- $l := include "kvindexd.selectorLabels" . | fromYaml -}}
{{- $out := list -}}
{{- range $k := keys $l | sortAlpha }}{{ $out = append $out (printf "%s=%s" $k (get $l $k)) }}{{ end -}}
{{- join "," $out -}}
{{- end }}
