{{/*
The single source of the permissions FlexInfer uses. Least privilege: named resources and verbs only,
no wildcards. Changing a rule here must go with a change to the RBAC expectations in the chart tests.
*/}}

{{/*
Manager, cluster-wide (kopf watches every namespace; the chart never passes --namespace). Each rule is a
call the code makes; docs/operations/rbac.md explains them. Not granted on purpose: namespaces (kopf lists/watches them only for --namespace, never
cluster-wide), update on Deployments/Services (server-side apply is a PATCH; create covers apply-create),
get/list/delete on Jobs (the cleanup Job is created, AlreadyExists is success), patch on Events.
*/}}
{{- define "flexinfer.manager.clusterRules" -}}
- apiGroups: ["ai.flexinfer"]
  resources: ["models"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["ai.flexinfer"]
  resources: ["models/status"]
  verbs: ["patch"]
- apiGroups: ["ai.flexinfer"]
  resources: ["models/finalizers"]
  verbs: ["update"]
- apiGroups: ["ai.flexinfer"]
  resources: ["modelcaches", "gpuleases", "modeldemands"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end }}

{{/* Manager, release namespace only: the leader-election Lease (read, create, replace). */}}
{{- define "flexinfer.manager.namespaceRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update"]
{{- end }}

{{/*
Proxy: read Models (the watch cache) and write only its own ModelDemand reports (create; merge/JSON patch;
delete at shutdown). No write on models or models/status: the proxy cannot change any Model. Bound by a
Role in the release namespace, or cluster-wide with proxy.allNamespaces=true. The proxy never reads
Services: status.endpoint carries the URL.
*/}}
{{- define "flexinfer.proxy.rules" -}}
- apiGroups: ["ai.flexinfer"]
  resources: ["models"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["ai.flexinfer"]
  resources: ["modeldemands"]
  verbs: ["create", "patch", "delete"]
{{- end }}

{{/*
The pre-delete hook (`flexinfer uninstall`, templates/uninstall-hook.yaml), cluster-wide: read Models and remove
their finalizer (patch); delete the model Deployments and Services; create the tmpfs cleanup Jobs, then wait for
them and delete them (list, delete); list pods (where each model ran; which model pods still run).
*/}}
{{- define "flexinfer.uninstall.clusterRules" -}}
- apiGroups: ["ai.flexinfer"]
  resources: ["models"]
  verbs: ["get", "list", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["create", "list", "delete"]
{{- end }}

{{/* The pre-delete hook, release namespace only: scale the manager's Deployment to zero first. */}}
{{- define "flexinfer.uninstall.namespaceRules" -}}
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "patch"]
{{- end }}
