{{- define "eztunnel.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The DaemonSet's name; the Role's resourceNames names it too. */}}
{{- define "eztunnel.fullname" -}}
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

{{- define "eztunnel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "eztunnel.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The labels of every object: the chart's, then commonLabels. */}}
{{- define "eztunnel.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "eztunnel.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- range $k, $v := .Values.commonLabels }}
{{- if has $k (list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by") }}
{{- fail (printf "commonLabels: %q is the chart's own label" $k) }}
{{- end }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}

{{/* An object's annotations block: commonAnnotations and the object's own
(dict "root" $ "own" <map>; its own win), or nothing when both are empty. */}}
{{- define "eztunnel.annotations" -}}
{{- $a := merge (dict) (.own | default dict) (.root.Values.commonAnnotations | default dict) }}
{{- with $a -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* More labels of one object (a map), leaving out those commonLabels has. */}}
{{- define "eztunnel.extraLabels" -}}
{{- $out := dict }}
{{- range $k, $v := .own }}
{{- if not (hasKey ($.root.Values.commonLabels | default dict) $k) }}
{{- $_ := set $out $k $v }}
{{- end }}
{{- end }}
{{- with $out }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* A probe's timing from its values, in Kubernetes' field order. */}}
{{- define "eztunnel.probeTiming" -}}
{{- range $f := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "successThreshold" "failureThreshold" }}
{{- if and (hasKey $ $f) (not (kindIs "invalid" (get $ $f))) }}
{{ $f }}: {{ get $ $f | int64 }}
{{- end }}
{{- end }}
{{- end }}

{{- define "eztunnel.serviceAccountName" -}}
{{- default (include "eztunnel.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{- define "eztunnel.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) }}
{{- with .Values.image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* The agent's arguments, one per line, from the values. */}}
{{- define "eztunnel.args" -}}
- run
- --kubernetes
- --node-name=$(NODE_NAME)
- --default-policy={{ .Values.defaultPolicy }}
- --cgroup2-root={{ .Values.cgroup2Path }}
{{- with .Values.podsCgroup }}
- --pods-cgroup={{ . }}
{{- end }}
- --cgroup-driver={{ .Values.cgroupDriver }}
- --pin-path={{ .Values.pinPath }}
- --lock-file={{ .Values.lockDir }}/agent.lock
- --run-dir={{ .Values.lockDir }}
- --takeover
{{- with .Values.takeoverTimeout }}
- --takeover-timeout={{ . }}
{{- end }}
- --uninstall-on-removal
- --metrics-addr={{ .Values.bindAddress }}:{{ .Values.metrics.port }}
- --health-addr={{ .Values.health.bindAddress }}:{{ .Values.health.port }}
{{- if not (kindIs "invalid" .Values.maxSockets) }}
- --max-sockets={{ int64 .Values.maxSockets }}
{{- end }}
{{- if not (kindIs "invalid" .Values.maxPairs) }}
- --max-pairs={{ int64 .Values.maxPairs }}
{{- end }}
{{- if not (kindIs "invalid" .Values.maxUnread) }}
- --max-unread={{ int64 .Values.maxUnread }}
{{- end }}
{{- with .Values.pairMaxAge }}
- --pair-max-age={{ . }}
{{- end }}
- --ipv6={{ .Values.ipv6 }}
- --adopt={{ .Values.adoption.enabled }}
{{- if .Values.adoption.enabled }}
- --adopt-interval={{ .Values.adoption.interval }}
{{- end }}
{{- with .Values.traffic.includePorts }}
- --include-ports={{ join "," . }}
{{- end }}
{{- with .Values.traffic.excludePorts }}
- --exclude-ports={{ join "," . }}
{{- end }}
{{- with .Values.traffic.includeCIDRs }}
- --include-cidrs={{ join "," . }}
{{- end }}
{{- with .Values.traffic.excludeCIDRs }}
- --exclude-cidrs={{ join "," . }}
{{- end }}
- --bypass={{ .Values.bypass }}
{{- if not .Values.bypassUDP }}
- --bypass-udp=false
{{- end }}
{{- if not .Values.bypassIPv6 }}
- --bypass-ipv6=false
{{- end }}
{{- if ne (toString .Values.bypassRecheck) "1ms" }}
- --bypass-recheck={{ .Values.bypassRecheck }}
{{- end }}
{{- if ne .Values.closeResetDevices "all" }}
- --close-reset-devices={{ .Values.closeResetDevices }}
{{- end }}
{{- if .Values.services.enabled }}
- --services
{{- end }}
{{- if .Values.services.nodePort.enabled }}
- --nodeport
{{- with .Values.services.nodePort.devices }}
- --nodeport-devices={{ join "," . }}
{{- end }}
{{- with .Values.services.nodePort.healthCheckAddresses }}
- --nodeport-healthcheck-addresses={{ join "," . }}
{{- end }}
{{- end }}
- --log-level={{ .Values.log.level }}
- --log-format={{ .Values.log.format }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
