# CheckResources over Cerbos's HTTP/JSON API on TCP, at CERBOS_PDP_HTTP_ADDR: the sidecar's HTTP port, the
# node's (the front's port 3592) or the central Service's.
curl -sS --fail "http://$CERBOS_PDP_HTTP_ADDR/api/check/resources" \
  -H 'Content-Type: application/json' -d @- <<'JSON'
{"requestId": "docs",
 "principal": {"id": "alice", "roles": ["user"]},
 "resources": [{"resource": {"kind": "document", "id": "1"}, "actions": ["view", "edit"]}]}
JSON
