{{/* Names and labels shared by the templates. */}}
{{- define "memcolo.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "memcolo.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "memcolo.labels" -}}
{{ include "memcolo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "memcolo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "memcolo.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* agent.toml: the user's config with the settings the chart owns. */}}
{{- define "memcolo.agentToml" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- range $k := list "scope" "socket" "metrics_addr" "kubernetes" -}}
{{- if hasKey $cfg $k -}}
{{- fail (printf "config.%s is set by the chart; use the chart's own values" $k) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cfg "socket" (printf "%s/agent.sock" .Values.socketDir) -}}
{{- $_ := set $cfg "state_dir" .Values.stateDir -}}
{{- $_ := set $cfg "metrics_addr" (printf "0.0.0.0:%d" (int .Values.metrics.port)) -}}
{{- $k8s := dict "enabled" true "burstable_class" .Values.kubernetes.burstableClass "publish_interval_s" (int .Values.kubernetes.publishIntervalSeconds) -}}
{{- if .Values.kubernetes.trustedNamespaces -}}
{{- $_ := set $k8s "trusted_namespaces" .Values.kubernetes.trustedNamespaces -}}
{{- end -}}
{{- if .Values.kubernetes.kubepodsCgroup -}}
{{- $_ := set $k8s "kubepods_cgroup" .Values.kubernetes.kubepodsCgroup -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.kubernetes.evictionGracePeriodSeconds) -}}
{{- $_ := set $k8s "eviction_grace_period_s" (int .Values.kubernetes.evictionGracePeriodSeconds) -}}
{{- end -}}
{{- $_ := set $cfg "kubernetes" $k8s -}}
{{- /* Helm reads every number in values as a float, and toToml writes 60 as 60.0,
       which the agent refuses for its integer settings: whole numbers are written
       as integers (the agent's float settings take integers too). */ -}}
{{- regexReplaceAll "(?m)= (-?[0-9]+)\\.0$" (toToml $cfg) "= ${1}" -}}
{{- end -}}
