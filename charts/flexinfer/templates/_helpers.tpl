{{/*
Names, labels and images shared by every template.
*/}}

{{- define "flexinfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or <release> when it already contains the chart name; max 63 chars. */}}
{{- define "flexinfer.fullname" -}}
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

{{- define "flexinfer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels. Call with (dict "ctx" $ "component" "manager"). */}}
{{- define "flexinfer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flexinfer.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Full label set for objects. Call with (dict "ctx" $ "component" "manager"). */}}
{{- define "flexinfer.labels" -}}
helm.sh/chart: {{ include "flexinfer.chart" .ctx }}
{{ include "flexinfer.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: flexinfer
{{- end }}

{{/* The one FlexInfer image: repository:tag, the tag defaulting to the chart appVersion; with image.digest,
pinned by content (repository@digest, or repository:tag@digest when a tag is given: the digest decides). */}}
{{- define "flexinfer.image" -}}
{{- $v := .Values.image }}
{{- if and $v.digest $v.tag }}
{{- printf "%s:%s@%s" $v.repository $v.tag $v.digest }}
{{- else if $v.digest }}
{{- printf "%s@%s" $v.repository $v.digest }}
{{- else }}
{{- printf "%s:%s" $v.repository (default .Chart.AppVersion $v.tag) }}
{{- end }}
{{- end }}

{{/* Flash-loader init container image: the explicit value, else the FlexInfer image. */}}
{{- define "flexinfer.flashLoaderImage" -}}
{{- default (include "flexinfer.image" .) .Values.controller.runtime.flashLoader.image }}
{{- end }}

{{- define "flexinfer.manager.fullname" -}}
{{- printf "%s-manager" (include "flexinfer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The manager's Deployment: <fullname>-controller (`deploy/flexinfer-controller` for a release named flexinfer). */}}
{{- define "flexinfer.controller.fullname" -}}
{{- printf "%s-controller" (include "flexinfer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The manager's metrics Service: <fullname>-controller-metrics, the Go chart's name (scrape configs key on it). */}}
{{- define "flexinfer.metricsService.fullname" -}}
{{- printf "%s-controller-metrics" (include "flexinfer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flexinfer.proxy.fullname" -}}
{{- printf "%s-proxy" (include "flexinfer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "flexinfer.manager.serviceAccountName" -}}
{{- default (include "flexinfer.manager.fullname" .) .Values.controller.serviceAccount.name }}
{{- end }}

{{- define "flexinfer.proxy.serviceAccountName" -}}
{{- default (include "flexinfer.proxy.fullname" .) .Values.proxy.serviceAccount.name }}
{{- end }}

{{/* policy/v1 where the cluster serves it (1.21+), else policy/v1beta1. */}}
{{- define "flexinfer.pdb.apiVersion" -}}
{{- if or (.Capabilities.APIVersions.Has "policy/v1/PodDisruptionBudget") (semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end }}
{{- end }}

{{/* imagePullSecrets block for a pod spec (nothing when the list is empty). */}}
{{- define "flexinfer.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Scheduling fields of a pod spec. Call with the component's values (controller or proxy). */}}
{{- define "flexinfer.scheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pre-delete hook's Job, ServiceAccount and roles: <fullname>-uninstall. */}}
{{- define "flexinfer.uninstall.fullname" -}}
{{- printf "%s-uninstall" (include "flexinfer.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
