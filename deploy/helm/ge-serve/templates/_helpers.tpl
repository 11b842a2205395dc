{{/* Names, labels and the server's command line, shared by the templates. */}}

{{- define "ge-serve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ge-serve.fullname" -}}
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

{{- define "ge-serve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ge-serve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ge-serve.labels" -}}
{{ include "ge-serve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ge-serve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ge-serve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The pod may take this long to stop: preStop sleep, then ge-serve's drain, then a margin. */}}
{{- define "ge-serve.gracePeriod" -}}
{{- add (int .Values.shutdown.preStopSleepSecs) (int (ceil .Values.server.exitTimeoutSecs)) (int .Values.shutdown.marginSecs) -}}
{{- end -}}

{{- define "ge-serve.device" -}}
{{- if and .Values.npu.enabled (eq .Values.server.device "auto") -}}npu{{- else -}}{{ .Values.server.device }}{{- end -}}
{{- end -}}

{{/* ge-serve's arguments, one flag per line. The restricted-API key comes from the
     container's environment ($(VAR) is expanded by the kubelet), never from values. */}}
{{- define "ge-serve.args" -}}
{{- $s := .Values.server -}}
- --model-repository={{ .Values.modelRepository.mountPath }}
- --http-port={{ .Values.ports.http }}
- --grpc-port={{ .Values.ports.grpc }}
- --metrics-port={{ .Values.ports.metrics }}
- --model-control-mode={{ $s.modelControlMode }}
{{- range $s.loadModels }}
- --load-model={{ . }}
{{- end }}
{{- if eq $s.modelControlMode "poll" }}
- --repository-poll-secs={{ $s.repositoryPollSecs }}
{{- end }}
- --exit-timeout-secs={{ $s.exitTimeoutSecs }}
- --strict-readiness={{ $s.strictReadiness }}
- --adaptive-batching={{ $s.adaptiveBatching }}
- --device={{ include "ge-serve.device" . }}
{{- if eq (include "ge-serve.device" .) "sim" }}
- --sim-devices={{ $s.simDevices }}
{{- end }}
- --atc-cache-dir=/tmp/atc-cache
- --log-verbose={{ $s.logVerbose }}
{{- if $s.restrictedApi.enabled }}
{{- $rule := printf "%s:%s=$(GE_SERVE_RESTRICTED_KEY)" (join "," $s.restrictedApi.categories) $s.restrictedApi.header }}
- --http-restricted-api={{ $rule }}
- --grpc-restricted-protocol={{ $rule }}
{{- end }}
{{- range $s.extraArgs }}
- {{ . }}
{{- end }}
{{- end -}}

{{/* Refuse values that would deploy something broken. */}}
{{- define "ge-serve.validate" -}}
{{- $r := .Values.server.restrictedApi -}}
{{- if $r.enabled -}}
{{- if not $r.existingSecret -}}
{{- fail "server.restrictedApi.existingSecret: name the Secret that holds the key" -}}
{{- end -}}
{{- if has "health" $r.categories -}}
{{- fail "server.restrictedApi.categories: \"health\" would lock out the kubelet's probes" -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.server.modelControlMode (list "none" "poll" "explicit")) -}}
{{- fail "server.modelControlMode: one of none, poll, explicit" -}}
{{- end -}}
{{- if and .Values.server.loadModels (ne .Values.server.modelControlMode "explicit") -}}
{{- fail "server.loadModels: needs server.modelControlMode explicit (ge-serve, as Triton, refuses --load-model otherwise)" -}}
{{- end -}}
{{- if not (has .Values.modelRepository.source (list "pvc" "initContainer")) -}}
{{- fail "modelRepository.source: pvc or initContainer" -}}
{{- end -}}
{{- if not (has .Values.autoscaling.metric (list "pending" "queueTime")) -}}
{{- fail "autoscaling.metric: pending or queueTime" -}}
{{- end -}}
{{- end -}}
