# One line per admission review: namespace, decision and reason code (the webhook logs JSON, as installed).
kubectl -n pdp-system logs -l app.kubernetes.io/name=pdp-injector --tail=-1 --since=1h |
  jq -c 'select(.message == "admission review answered") | .span | {namespace, operation, decision, reason}'
