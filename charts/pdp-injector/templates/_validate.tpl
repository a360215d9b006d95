{{/* The combinations of values the chart refuses, each with what to set instead (rendered by validate.yaml). */}}
{{- define "pdp.validate" -}}
{{- $v := .Values -}}
{{- $central := include "pdp.central" . -}}
{{- $node := include "pdp.node" . -}}
{{- $tls := $v.pdp.nodeLocal.tls -}}
{{- $flagd := $v.pdp.flagdNode -}}
{{- if and (eq $v.pdp.model "central") (not $central) -}}
{{- fail "pdp.model is central but pdp.central.enabled is false: central mode would point at no PDP" -}}
{{- end -}}
{{- if and (eq $v.pdp.model "daemonset") (not $node) -}}
{{- fail "pdp.model is daemonset but pdp.nodeLocal.enabled is false: daemonset mode would point at no PDP" -}}
{{- end -}}
{{- if and $tls.clientIds (not $tls.clientCertificates) -}}
{{- fail "pdp.nodeLocal.tls.clientIds are read from client certificates: they need pdp.nodeLocal.tls.clientCertificates" -}}
{{- end -}}
{{- if and $v.pdp.nodeLocal.fallback (not (and $central $node)) -}}
{{- fail "pdp.nodeLocal.fallback sends the node's connections to the central Cerbos while its node's PDP is away: it needs both (pdp.model daemonset with pdp.central.enabled, or the reverse)" -}}
{{- end -}}
{{- if and (or $tls.clientCertificates $tls.certManager) (not $tls.enabled) -}}
{{- fail "pdp.nodeLocal.tls.clientCertificates and .certManager need pdp.nodeLocal.tls.enabled" -}}
{{- end -}}
{{- if and $tls.enabled (not $node) -}}
{{- fail "pdp.nodeLocal.tls.enabled needs the node-local PDP (pdp.model daemonset or pdp.nodeLocal.enabled)" -}}
{{- end -}}
{{- $pdb := $v.podDisruptionBudget -}}
{{- if not (or (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable)) -}}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both" -}}
{{- end -}}
{{- if and $node $v.pdp.nodeLocal.service.enabled (semverCompare "<1.22-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "pdp.nodeLocal.service needs Kubernetes 1.22+ (internalTrafficPolicy), the cluster is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and (not $flagd.enabled) (or $flagd.installCRD (eq $flagd.flagSource "file") $flagd.sharedFront) -}}
{{- fail "pdp.flagdNode.installCRD, flagSource: file and sharedFront need pdp.flagdNode.enabled" -}}
{{- end -}}
{{- if and $flagd.sharedFront (not $node) -}}
{{- fail "pdp.flagdNode.sharedFront moves flagd's listeners into the node-local Cerbos front: it needs the node-local PDP" -}}
{{- end -}}
{{- end -}}
