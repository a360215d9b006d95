{{/*
The chart's objects are the kustomize manifests (files/ is a link to manifests/): these helpers read them,
apply what the manifests' components and overlays do (their kustomization.yaml files are read, not copied),
and what the values and the cluster's version ask for. scripts/helm-check.sh compares every rendering with
the equivalent overlay, object by object.
*/}}

{{/* The YAML documents of one manifests file, as a YAML list: (list $ "base/rbac.yaml"). */}}
{{- define "pdp.docs" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $text := $root.Files.Get (printf "files/%s" $path) -}}
{{- if not $text -}}
{{- fail (printf "manifests/%s is missing or empty (the chart reads it through files/)" $path) -}}
{{- end -}}
{{- $docs := list -}}
{{- range regexSplit "(?m)^---[ \t]*$" $text -1 -}}
{{- $d := fromYaml . -}}
{{- if hasKey $d "Error" -}}
{{- fail (printf "manifests/%s: %s" $path $d.Error) -}}
{{- end -}}
{{- if $d.kind -}}
{{- $docs = append $docs $d -}}
{{- end -}}
{{- end -}}
{{- toYaml $docs -}}
{{- end -}}

{{/* A kustomization.yaml as a YAML map: (list $ "components/pdp-daemonset"). */}}
{{- define "pdp.kustomization" -}}
{{- $root := index . 0 -}}
{{- $dir := index . 1 -}}
{{- $k := fromYaml ($root.Files.Get (printf "files/%s/kustomization.yaml" $dir)) -}}
{{- if or (hasKey $k "Error") (not $k.kind) -}}
{{- fail (printf "manifests/%s/kustomization.yaml is missing or does not parse" $dir) -}}
{{- end -}}
{{- toYaml $k -}}
{{- end -}}

{{/*
The objects of one kustomization directory: its resources and its configMapGenerator ConfigMaps (stable
names only), with its `labels` (metadata only, as includeSelectors: false does). (list $ dir overrides), where
overrides maps a generated ConfigMap's name to {key: text} that replaces the file's content.
*/}}
{{- define "pdp.objects" -}}
{{- include "pdp.objects.of" (list (index . 0) (index . 1) (fromYaml (include "pdp.kustomization" (list (index . 0) (index . 1)))) (index . 2)) -}}
{{- end -}}

{{/* The same from a parsed kustomization: (list $ dir kustomization overrides). */}}
{{- define "pdp.objects.of" -}}
{{- $root := index . 0 -}}
{{- $dir := index . 1 -}}
{{- $k := index . 2 -}}
{{- $overrides := index . 3 -}}
{{- $objs := list -}}
{{- range $k.resources -}}
{{- $objs = concat $objs (fromYamlArray (include "pdp.docs" (list $root (printf "%s/%s" $dir .)))) -}}
{{- end -}}
{{- range $k.configMapGenerator -}}
{{- $g := . -}}
{{- if not (and $g.options $g.options.disableNameSuffixHash) -}}
{{- fail (printf "manifests/%s: configMapGenerator %s must set disableNameSuffixHash (the chart keeps names stable)" $dir $g.name) -}}
{{- end -}}
{{- $data := dict -}}
{{- range $g.files -}}
{{- $parts := splitList "=" . -}}
{{- $key := base (last $parts) -}}
{{- if eq (len $parts) 2 -}}{{- $key = first $parts -}}{{- end -}}
{{- $text := $root.Files.Get (printf "files/%s/%s" $dir (last $parts)) -}}
{{- if not $text -}}
{{- fail (printf "manifests/%s/%s is missing or empty" $dir (last $parts)) -}}
{{- end -}}
{{- $_ := set $data $key $text -}}
{{- end -}}
{{- $over := get $overrides $g.name -}}
{{- if $over -}}{{- $data = merge (deepCopy $over) $data -}}{{- end -}}
{{- $meta := dict "name" $g.name "namespace" $g.namespace -}}
{{- if $g.options.labels -}}{{- $_ := set $meta "labels" (deepCopy $g.options.labels) -}}{{- end -}}
{{- $objs = append $objs (dict "apiVersion" "v1" "kind" "ConfigMap" "metadata" $meta "data" $data) -}}
{{- end -}}
{{- range $k.labels -}}
{{- $pairs := .pairs -}}
{{- range $objs -}}
{{- $o := . -}}
{{- if not $o.metadata.labels -}}{{- $_ := set $o.metadata "labels" dict -}}{{- end -}}
{{- range $lk, $lv := $pairs -}}{{- $_ := set $o.metadata.labels $lk $lv -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $objs -}}
{{- end -}}

{{/* Whether object o is the target t of a kustomize patch (kind, name, group; unset fields match all). */}}
{{- define "pdp.matches" -}}
{{- $o := index . 0 -}}
{{- $t := index . 1 -}}
{{- $group := "" -}}
{{- if contains "/" $o.apiVersion -}}{{- $group = first (splitList "/" $o.apiVersion) -}}{{- end -}}
{{- if and (or (not $t.kind) (eq $t.kind $o.kind)) (or (not $t.name) (eq $t.name $o.metadata.name)) (or (not (hasKey $t "group")) (eq $t.group $group)) (or (not $t.namespace) (eq $t.namespace ($o.metadata.namespace | default ""))) -}}
true
{{- end -}}
{{- end -}}

{{/*
JSON patch (RFC 6902) ops on one object, the subset the manifests use: test, add (a map key, or "-" to append to
a list), replace (a map key or a list element) and remove (map keys). (list obj ops where). A failing test fails the rendering, as kustomize does.
*/}}
{{- define "pdp.jsonpatch" -}}
{{- $obj := index . 0 -}}
{{- $where := index . 2 -}}
{{- range index . 1 -}}
{{- $op := . -}}
{{- $segs := list -}}
{{- range rest (splitList "/" $op.path) -}}{{- $segs = append $segs (replace "~0" "~" (replace "~1" "/" .)) -}}{{- end -}}
{{- $last := last $segs -}}
{{- $parent := $obj -}}
{{- $gp := dict -}}
{{- $gpKey := "" -}}
{{- range initial $segs -}}
{{- $gp = $parent -}}
{{- $gpKey = . -}}
{{- if kindIs "slice" $parent -}}
{{- if ge (atoi .) (len $parent) -}}{{- fail (printf "%s: %s %s: no element %s" $where $op.op $op.path .) -}}{{- end -}}
{{- $parent = index $parent (atoi .) -}}
{{- else if and (kindIs "map" $parent) (hasKey $parent .) -}}
{{- $parent = index $parent . -}}
{{- else -}}
{{- fail (printf "%s: %s %s: no %s" $where $op.op $op.path .) -}}
{{- end -}}
{{- end -}}
{{- if eq $op.op "test" -}}
{{- $got := "" -}}
{{- if kindIs "slice" $parent -}}{{- $got = index $parent (atoi $last) -}}{{- else -}}{{- $got = get $parent $last -}}{{- end -}}
{{- if ne (toJson $got) (toJson $op.value) -}}
{{- fail (printf "%s: test %s: want %s, have %s" $where $op.path (toJson $op.value) (toJson $got)) -}}
{{- end -}}
{{- else if and (eq $op.op "add") (eq $last "-") (kindIs "slice" $parent) -}}
{{- if kindIs "slice" $gp -}}{{- fail (printf "%s: add %s: a list inside a list" $where $op.path) -}}{{- end -}}
{{- $_ := set $gp $gpKey (append $parent (deepCopy $op.value)) -}}
{{- else if and (eq $op.op "replace") (kindIs "slice" $parent) (regexMatch "^[0-9]+$" $last) -}}
{{- if or (kindIs "slice" $gp) (ge (atoi $last) (len $parent)) -}}{{- fail (printf "%s: replace %s: no such element" $where $op.path) -}}{{- end -}}
{{- $new := list -}}
{{- range $i, $e := $parent -}}{{- $new = append $new (ternary (deepCopy (dict "v" $op.value)).v $e (eq $i (atoi $last))) -}}{{- end -}}
{{- $_ := set $gp $gpKey $new -}}
{{- else if and (has $op.op (list "add" "replace")) (kindIs "map" $parent) -}}
{{- if and (eq $op.op "replace") (not (hasKey $parent $last)) -}}{{- fail (printf "%s: replace %s: no such key" $where $op.path) -}}{{- end -}}
{{- $val := $op.value -}}
{{- if or (kindIs "map" $val) (kindIs "slice" $val) -}}{{- $val = deepCopy $val -}}{{- end -}}
{{- $_ := set $parent $last $val -}}
{{- else if and (eq $op.op "remove") (kindIs "map" $parent) (hasKey $parent $last) -}}
{{- $_ := unset $parent $last -}}
{{- else -}}
{{- fail (printf "%s: %s %s: not supported by the chart (test, add, replace, remove on maps; add - on lists)" $where $op.op $op.path) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Strategic merge of src into dst, as the manifests' patches need it: maps merge, lists of named items merge by
name (volumeMounts by mountPath; new items first, as kustomize does), other lists and scalars are replaced. (list dst src).
*/}}
{{- define "pdp.smp" -}}
{{- $dst := index . 0 -}}
{{- $src := index . 1 -}}
{{- range $k, $sv := $src -}}
{{- if eq $k "$patch" -}}
{{- else if and (kindIs "map" $sv) (kindIs "map" (get $dst $k)) -}}
{{- include "pdp.smp" (list (get $dst $k) $sv) -}}
{{- else if and (kindIs "slice" $sv) (kindIs "slice" (get $dst $k)) (gt (len $sv) 0) (kindIs "map" (first $sv)) -}}
{{- $mk := "name" -}}
{{- if eq $k "volumeMounts" -}}{{- $mk = "mountPath" -}}{{- end -}}
{{- $list := get $dst $k -}}
{{- $new := list -}}
{{- range $sv -}}
{{- $item := . -}}
{{- $found := false -}}
{{- range $list -}}
{{- if and (not $found) (eq (toString (get . $mk)) (toString (get $item $mk))) -}}
{{- include "pdp.smp" (list . $item) -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}{{- $new = append $new (deepCopy $item) -}}{{- end -}}
{{- end -}}
{{- /* kustomize puts the patch's new items first. */ -}}
{{- $_ := set $dst $k (concat $new $list) -}}
{{- else -}}
{{- $val := $sv -}}
{{- if or (kindIs "map" $sv) (kindIs "slice" $sv) -}}{{- $val = deepCopy $sv -}}{{- end -}}
{{- $_ := set $dst $k $val -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Applies one kustomization directory (a Component or an overlay) to state.objs, as kustomize does: its own
resources (not the ../ ones an overlay builds on) and generated ConfigMaps are added, then its patches (JSON
6902 with a target, strategic merge or $patch: delete, inline or from a file) change what is there so far.
(list $ state dir overrides).
*/}}
{{- define "pdp.apply" -}}
{{- $root := index . 0 -}}
{{- $state := index . 1 -}}
{{- $dir := index . 2 -}}
{{- $overrides := index . 3 -}}
{{- $k := fromYaml (include "pdp.kustomization" (list $root $dir)) -}}
{{- $own := deepCopy $k -}}
{{- $res := list -}}
{{- range $k.resources -}}{{- if not (hasPrefix "../" .) -}}{{- $res = append $res . -}}{{- end -}}{{- end -}}
{{- $_ := set $own "resources" $res -}}
{{- $added := fromYamlArray (include "pdp.objects.of" (list $root $dir $own $overrides)) -}}
{{- $_ := set $state "objs" (concat $state.objs $added) -}}
{{- range $i, $p := $k.patches -}}
{{- $where := printf "manifests/%s/kustomization.yaml patches[%d]" $dir $i -}}
{{- $docs := list -}}
{{- if $p.path -}}
{{- $docs = fromYamlArray (include "pdp.docs" (list $root (printf "%s/%s" $dir $p.path))) -}}
{{- else if hasPrefix "-" (trim $p.patch) -}}
{{- $ops := fromYamlArray $p.patch -}}
{{- $n := 0 -}}
{{- range $state.objs -}}
{{- if include "pdp.matches" (list . $p.target) -}}
{{- include "pdp.jsonpatch" (list . $ops $where) -}}
{{- $n = add1 $n -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $docs = list (fromYaml $p.patch) -}}
{{- end -}}
{{- range $docs -}}
{{- $d := . -}}
{{- $t := dict "kind" $d.kind "name" $d.metadata.name "namespace" ($d.metadata.namespace | default "") -}}
{{- if eq (get $d "$patch" | default "") "delete" -}}
{{- $kept := list -}}
{{- range $state.objs -}}{{- if not (include "pdp.matches" (list . $t)) -}}{{- $kept = append $kept . -}}{{- end -}}{{- end -}}
{{- $_ := set $state "objs" $kept -}}
{{- else -}}
{{- range $state.objs -}}
{{- if include "pdp.matches" (list . $t) -}}{{- include "pdp.smp" (list . $d) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* An image reference from values {registry, repository, tag, digest}: by digest when one is given (the tag
is then informative only), else by tag. */}}
{{- define "pdp.image" -}}
{{- if .digest -}}{{- printf "%s/%s@%s" .registry .repository .digest -}}{{- else -}}{{- printf "%s/%s:%s" .registry .repository .tag -}}{{- end -}}
{{- end -}}

{{/* Indents a YAML block by two spaces (under profiles:). */}}
{{- define "pdp.indent" -}}
{{- range splitList "\n" (trimSuffix "\n" .) }}
  {{ . }}
{{- end -}}
{{- end -}}

{{/* An object as YAML, with the labels that say Helm manages it (metadata only, never selectors). */}}
{{- define "pdp.labelled" -}}
{{- $root := index . 0 -}}
{{- $o := index . 1 -}}
{{- if not $o.metadata.labels -}}{{- $_ := set $o.metadata "labels" dict -}}{{- end -}}
{{- $_ := set $o.metadata.labels "app.kubernetes.io/managed-by" $root.Release.Service -}}
{{- $_ := set $o.metadata.labels "helm.sh/chart" (printf "%s-%s" $root.Chart.Name $root.Chart.Version) -}}
{{- toYaml $o -}}
{{- end -}}

{{/* The labels of the objects the chart writes itself (those not read from the manifests). */}}
{{- define "pdp.labels" -}}
app.kubernetes.io/part-of: pdp-injector
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Fails unless the cluster serves an API: (list $ "group/version/Kind" skip "the value that needs it"). */}}
{{- define "pdp.requireAPI" -}}
{{- $root := index . 0 -}}
{{- $api := index . 1 -}}
{{- if not (or (index . 2) ($root.Capabilities.APIVersions.Has $api)) -}}
{{- fail (printf "%s.enabled needs the API %s (the Prometheus Operator's CRDs), which the cluster does not serve: install them, or set %s.skipCapabilityCheck (helm template: --api-versions %s)" (index . 3) $api (index . 3) $api) -}}
{{- end -}}
{{- end -}}

{{/* The PodDisruptionBudget's minAvailable or maxUnavailable from podDisruptionBudget, as YAML lines. */}}
{{- define "pdp.pdbBudget" -}}
{{- if not (kindIs "invalid" .maxUnavailable) -}}
maxUnavailable: {{ toJson .maxUnavailable }}
{{- else -}}
minAvailable: {{ ternary 1 .minAvailable (kindIs "invalid" .minAvailable) | toJson }}
{{- end -}}
{{- end -}}
