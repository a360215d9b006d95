# Injected Pods by mode, profile, config hash and injector version: which Pods still run with an old wiring.
kubectl get pods -A -o json | jq -r '.items[]
  | .metadata.annotations["pdp-injector.io/status"] // empty
  | fromjson | "\(.mode) \(.profile) \(.configHash) \(.version)"' | sort | uniq -c
