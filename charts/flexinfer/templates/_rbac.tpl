{{/*
The single source of the permissions FlexInfer uses. Least privilege: named resources and verbs only,
no wildcards. Changing a rule here must go with a change to the RBAC expectations in the chart tests.
*/}}

{{/* Manager, cluster-wide (kopf watches every namespace). */}}
{{- define "flexinfer.manager.clusterRules" -}}
- apiGroups: ["ai.flexinfer"]
  resources: ["models", "models/status", "models/finalizers"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["ai.flexinfer"]
  resources: ["modelcaches", "gpuleases"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "get", "list", "watch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}

{{/* Manager, release namespace only: the leader-election Lease. */}}
{{- define "flexinfer.manager.namespaceRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update", "patch"]
{{- end }}

{{/* Proxy, cluster-wide: resolve Models and their Services, record demand in status.lastActiveTime. */}}
{{- define "flexinfer.proxy.clusterRules" -}}
- apiGroups: ["ai.flexinfer"]
  resources: ["models"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["ai.flexinfer"]
  resources: ["models/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch"]
{{- end }}
