# Pods that opted in (annotation or label) but carry no pdp-injector.io/status: created while the webhook was
# unreachable (the Ignore webhook let them through) or before it was installed.
kubectl get pods -A -o json | jq -r '.items[]
  | select(.metadata.annotations["pdp-injector.io/inject"] // .metadata.labels["pdp-injector.io/inject"]
           | . != null and . != "disabled")
  | select(.metadata.annotations["pdp-injector.io/status"] == null)
  | "\(.metadata.namespace)/\(.metadata.name)"'
