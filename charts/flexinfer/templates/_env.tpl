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

{{/* POD_UID from the downward API: the proxy's ModelDemand report in its namespace is owned by its pod. */}}
{{- define "flexinfer.env.podUid" -}}
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
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
{{/* Log settings of one component: pass its values block (`controller` or `proxy`); accessLog only for the proxy. */}}
{{- define "flexinfer.env.logging" -}}
{{- with .logging }}
- name: FLEXINFER_LOG_LEVEL
  value: {{ .level | default "INFO" | quote }}
- name: FLEXINFER_LOG_FORMAT
  value: {{ .format | default "text" | quote }}
{{- if hasKey . "accessLog" }}
- name: FLEXINFER_ACCESS_LOG
  value: {{ .accessLog | quote }}
{{- end }}
{{- end }}
{{- end }}

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
{{- with .maxRate }}
- name: DEFAULT_FLASH_LOADER_MAX_RATE
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

{{/* The swap policy (both components: the manager's election, the proxy's start-up check of maxWait).
Guarded: `helm upgrade --reuse-values` from a chart without `swap` keeps the old defaults, which lack it (the
programs' defaults are the same as values.yaml's). */}}
{{- define "flexinfer.env.swap" -}}
{{- with .Values.swap }}
{{- with .minHold }}
- name: FLEXINFER_SWAP_MIN_HOLD
  value: {{ . | quote }}
{{- end }}
{{- with .maxWait }}
- name: FLEXINFER_SWAP_MAX_WAIT
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The manager's GPU profiles (groups that pack by memory): FLEXINFER_GPU_PROFILES as JSON, when any; and
whether it asks starting pods directly and publishes a Ready model's pod (FLEXINFER_POD_ENDPOINTS, always); the
shared groups that run in a group pod (FLEXINFER_GROUP_STRATEGIES, when any). */}}
{{- define "flexinfer.env.gpuProfiles" -}}
{{- with .Values.controller.gpuProfiles }}
- name: FLEXINFER_GPU_PROFILES
  value: {{ toJson . | quote }}
{{- end }}
- name: FLEXINFER_POD_ENDPOINTS
  value: {{ .Values.controller.podEndpoints | quote }}
{{- with .Values.controller.groupStrategies }}
- name: FLEXINFER_GROUP_STRATEGIES
  value: {{ include "flexinfer.groupStrategies" . | quote }}
{{- end }}
{{- end }}

{{/* controller.groupStrategies ({group: strategy}) as FLEXINFER_GROUP_STRATEGIES: GROUP=STRATEGY,... */}}
{{- define "flexinfer.groupStrategies" -}}
{{- $pairs := list }}
{{- range $group, $strategy := . }}
{{- $pairs = append $pairs (printf "%s=%s" $group $strategy) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* Proxy queue, rate-limit and auth settings. */}}
{{- define "flexinfer.env.proxy" -}}
{{- with .Values.proxy }}
- name: PROXY_QUEUE_TIMEOUT
  value: {{ .timeouts.queue | quote }}
- name: PROXY_COLD_START_TIMEOUT
  value: {{ .timeouts.coldStart | quote }}
- name: PROXY_STALL_TIMEOUT
  value: {{ .timeouts.stall | quote }}
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

{{/*
A container's env: the chart-set entries (`base`, rendered YAML), then the user's `extra` list. An `extra`
entry naming a chart-set variable replaces it (the user's value wins; no duplicate names, which
server-side apply refuses); `extra` naming one variable twice fails the render.
Called as (dict "base" <yaml> "extra" <list> "key" "controller.extraEnv").
*/}}
{{- define "flexinfer.env.merged" -}}
{{- $extra := .extra | default list }}
{{- $names := dict }}
{{- range $extra }}
{{- if hasKey $names .name }}
{{- fail (printf "%s names %s twice; give each variable once" $.key .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- end }}
{{- $env := list }}
{{- range (.base | fromYamlArray) }}
{{- if not (hasKey $names .name) }}
{{- $env = append $env . }}
{{- end }}
{{- end }}
{{- with concat $env $extra }}
{{- toYaml . }}
{{- end }}
{{- end }}
