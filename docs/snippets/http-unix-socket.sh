# CheckResources over Cerbos's HTTP/JSON API on the node-local PDP's Unix socket (the host part of the URL is
# ignored; curl needs one).
curl -sS --fail --unix-socket "$CERBOS_PDP_SOCKET" http://localhost/api/check/resources \
  -H 'Content-Type: application/json' -d @- <<'JSON'
{"requestId": "docs",
 "principal": {"id": "alice", "roles": ["user"]},
 "resources": [{"resource": {"kind": "document", "id": "1"}, "actions": ["view", "edit"]}]}
JSON
