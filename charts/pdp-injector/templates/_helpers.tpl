{{/* An image reference from values {registry, repository, tag, digest}: by digest when one is given (the tag
is then informative only), else by tag. */}}
{{- define "pdp.image" -}}
{{- if .digest -}}{{- printf "%s/%s@%s" .registry .repository .digest -}}{{- else -}}{{- printf "%s/%s:%s" .registry .repository .tag -}}{{- end -}}
{{- end -}}

{{/* The labels of every object of the install (metadata only, never selectors). */}}
{{- define "pdp.labels" -}}
app.kubernetes.io/part-of: pdp-injector
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* "true" when the central Cerbos is installed: pdp.model central, or pdp.central.enabled. */}}
{{- define "pdp.central" -}}
{{- $on := eq .Values.pdp.model "central" -}}
{{- if not (kindIs "invalid" .Values.pdp.central.enabled) -}}{{- $on = .Values.pdp.central.enabled -}}{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/* "true" when the node-local Cerbos is installed: pdp.model daemonset, or pdp.nodeLocal.enabled. */}}
{{- define "pdp.node" -}}
{{- $on := eq .Values.pdp.model "daemonset" -}}
{{- if not (kindIs "invalid" .Values.pdp.nodeLocal.enabled) -}}{{- $on = .Values.pdp.nodeLocal.enabled -}}{{- end -}}
{{- if $on -}}true{{- end -}}
{{- end -}}

{{/* "true" when the cluster has ValidatingAdmissionPolicy v1 (Kubernetes 1.30+): the guards are installed. */}}
{{- define "pdp.vap" -}}
{{- if semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- end -}}

{{/* A Namespace's labels beyond pdp.labels: on Kubernetes before 1.21, kubernetes.io/metadata.name, which
later versions set themselves and the webhook configuration's exclusions select on. (list $ name) */}}
{{- define "pdp.namespaceName" -}}
{{- if semverCompare "<1.21-0" (index . 0).Capabilities.KubeVersion.Version }}
kubernetes.io/metadata.name: {{ index . 1 }}
{{- end -}}
{{- end -}}

{{/* A DaemonSet's rollingUpdate: one surge Pod (the new PDP starts before the old one stops), or, before
Kubernetes 1.22 (no DaemonSet surge), replaced in place: the front holds new connections until the new PDP
listens. */}}
{{- define "pdp.daemonSetRollingUpdate" -}}
{{- if semverCompare "<1.22-0" .Capabilities.KubeVersion.Version -}}
maxUnavailable: 1
{{- else -}}
maxSurge: 1
maxUnavailable: 0
{{- end -}}
{{- end -}}

{{/* A PodDisruptionBudget's apiVersion and its spec's budget lines (minAvailable or maxUnavailable from
podDisruptionBudget, else minAvailable 1). */}}
{{- define "pdp.pdbApiVersion" -}}
{{- if semverCompare "<1.21-0" .Capabilities.KubeVersion.Version -}}policy/v1beta1{{- else -}}policy/v1{{- end -}}
{{- end -}}
{{- define "pdp.pdbBudget" -}}
{{- if not (kindIs "invalid" .maxUnavailable) -}}
maxUnavailable: {{ toJson .maxUnavailable }}
{{- else -}}
minAvailable: {{ ternary 1 .minAvailable (kindIs "invalid" .minAvailable) | toJson }}
{{- end -}}
{{- end -}}
{{- define "pdp.pdbEviction" -}}
{{- if semverCompare ">=1.27-0" .Capabilities.KubeVersion.Version -}}
unhealthyPodEvictionPolicy: AlwaysAllow # a crash-looping replica never blocks a drain
{{- end -}}
{{- end -}}

{{/* Fails unless the cluster serves an API: (list $ "group/version/Kind" skip "the value that needs it"). */}}
{{- define "pdp.requireAPI" -}}
{{- $root := index . 0 -}}
{{- $api := index . 1 -}}
{{- if not (or (index . 2) ($root.Capabilities.APIVersions.Has $api)) -}}
{{- fail (printf "%s.enabled needs the API %s (the Prometheus Operator's CRDs), which the cluster does not serve: install them, or set %s.skipCapabilityCheck (helm template: --api-versions %s)" (index . 3) $api (index . 3) $api) -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the webhook configuration never sends: the control plane's and the install's own. */}}
{{- define "pdp.excludedNamespaces" -}}
{{- $ns := list "pdp-system" "kube-system" "kube-public" "kube-node-lease" -}}
{{- if include "pdp.central" . -}}{{- $ns = append $ns "pdp-central" -}}{{- end -}}
{{- if include "pdp.node" . -}}{{- $ns = append $ns "pdp-node" -}}{{- end -}}
{{- if .Values.pdp.flagdNode.enabled -}}{{- $ns = append $ns "flagd-node" -}}{{- end -}}
{{- toJson $ns -}}
{{- end -}}

{{/* The Cerbos policies ConfigMap of a PDP's namespace: the sample policy (files/policies/document.yaml).
(list $ namespace) */}}
{{- define "pdp.cerbosPolicies" -}}
{{- $root := index . 0 -}}
# The sample policy (files/policies/document.yaml); replace this ConfigMap's data with your policies.
apiVersion: v1
kind: ConfigMap
metadata:
  name: cerbos-policies
  namespace: {{ index . 1 }}
  labels:
    {{- include "pdp.labels" $root | nindent 4 }}
    app.kubernetes.io/name: cerbos-pdp
data:
  document.yaml: |
    {{- $root.Files.Get "files/policies/document.yaml" | nindent 4 }}
{{- end -}}
