# CheckResources over Cerbos's HTTP/JSON API on TCP: the sidecar's HTTP port 3592 on CERBOS_PDP_HOST (127.0.0.1).
curl -sS --fail "http://$CERBOS_PDP_HOST:3592/api/check/resources" \
  -H 'Content-Type: application/json' -d @- <<'JSON'
{"requestId": "docs",
 "principal": {"id": "alice", "roles": ["user"]},
 "resources": [{"resource": {"kind": "document", "id": "1"}, "actions": ["view", "edit"]}]}
JSON
