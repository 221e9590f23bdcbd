{{/*
Container environment for the manager and the proxy. The env names are the contract with
`flexinfer manager` / `flexinfer proxy` (see docs/CONFIGURATION.md).
*/}}

{{/* POD_NAMESPACE from the downward API (both components). */}}
{{- define "flexinfer.env.podNamespace" -}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{/* POD_NAME from the downward API: the manager's Lease identity, the proxy's in-flight report name. */}}
{{- define "flexinfer.env.podName" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}

{{/* OpenTelemetry env: nothing unless observability.tracing.enabled. Used by BOTH components. */}}
{{- define "flexinfer.env.tracing" -}}
{{- with .Values.observability.tracing }}
{{- if .enabled }}
- name: FLEXINFER_OTEL_ENABLED
  value: "true"
{{- with .otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .serviceNamespace }}
- name: FLEXINFER_OTEL_SERVICE_NAMESPACE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Proxy only: FLEXINFER_OTEL_TRUST_INCOMING=false whenever observability.tracing.trustIncoming is false,
with tracing on or off: with tracing off the proxy still strips the clients' traceparent/tracestate/baggage
before forwarding (docs/tracing.md). Nothing for the default (true, the program's default too).
*/}}
{{- define "flexinfer.env.proxyTracing" -}}
{{- if not .Values.observability.tracing.trustIncoming }}
- name: FLEXINFER_OTEL_TRUST_INCOMING
  value: "false"
{{- end }}
{{- end }}

{{/* Manager runtime defaults: DEFAULT_FLASH_LOADER_ENABLED always, the rest (incl. DEFAULT_<BACKEND>_IMAGE
and DEFAULT_MODEL_IMAGE_PULL_POLICY) only when set. */}}
{{- define "flexinfer.env.runtimeDefaults" -}}
{{- $runtime := .Values.controller.runtime }}
{{- with $runtime.shmSizeLimit }}
- name: DEFAULT_SHM_SIZE_LIMIT
  value: {{ . | quote }}
{{- end }}
{{- with $runtime.flashLoader }}
- name: DEFAULT_FLASH_LOADER_ENABLED
  value: {{ .enabled | quote }}
- name: DEFAULT_FLASH_LOADER_IMAGE
  value: {{ include "flexinfer.flashLoaderImage" $ | quote }}
{{- if not (kindIs "invalid" .concurrency) }}
- name: DEFAULT_FLASH_LOADER_CONCURRENCY
  value: {{ .concurrency | quote }}
{{- end }}
{{- with .tmpfsSizeLimit }}
- name: DEFAULT_FLASH_LOADER_TMPFS_SIZE_LIMIT
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- range $backend, $image := $runtime.backendImages }}
{{- if $image }}
- name: DEFAULT_{{ $backend | upper | replace "-" "_" | replace "." "_" }}_IMAGE
  value: {{ $image | quote }}
{{- end }}
{{- end }}
{{- with $runtime.modelImagePullPolicy }}
- name: DEFAULT_MODEL_IMAGE_PULL_POLICY
  value: {{ . | quote }}
{{- end }}
{{- end }}

{{/* Proxy queue, rate-limit and auth settings. */}}
{{- define "flexinfer.env.proxy" -}}
{{- with .Values.proxy }}
- name: PROXY_QUEUE_TIMEOUT
  value: {{ .timeouts.queue | quote }}
- name: PROXY_COLD_START_TIMEOUT
  value: {{ .timeouts.coldStart | quote }}
- name: PROXY_MAX_QUEUE_SIZE
  value: {{ .maxQueueSize | quote }}
{{- if .allNamespaces }}
- name: FLEXINFER_PROXY_ALL_NAMESPACES
  value: "true"
{{- end }}
{{- if .rateLimit.enabled }}
- name: PROXY_RATE_LIMIT_ENABLED
  value: "true"
- name: PROXY_RATE_LIMIT_PER_MODEL
  value: {{ .rateLimit.perModelRPS | quote }}
- name: PROXY_RATE_LIMIT_BURST
  value: {{ .rateLimit.burst | quote }}
- name: PROXY_RATE_LIMIT_GLOBAL
  value: {{ .rateLimit.globalRPS | quote }}
- name: PROXY_RATE_LIMIT_GLOBAL_BURST
  value: {{ .rateLimit.globalBurst | quote }}
{{- end }}
{{- if .auth.enabled }}
- name: PROXY_AUTH_ENABLED
  value: "true"
- name: PROXY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ required "proxy.auth.tokenSecretName must name an existing Secret when proxy.auth.enabled=true" .auth.tokenSecretName }}
      key: {{ .auth.tokenSecretKey }}
{{- end }}
{{- end }}
{{- end }}
