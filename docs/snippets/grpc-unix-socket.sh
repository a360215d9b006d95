# The same gRPC health check over the Unix socket: the DaemonSet's HTTP listener there also serves gRPC.
printf '\0\0\0\0\0' |
  curl -sS --fail --http2-prior-knowledge --data-binary @- --unix-socket "$CERBOS_PDP_SOCKET" \
    -H 'Content-Type: application/grpc' -H 'TE: trailers' \
    "http://localhost/grpc.health.v1.Health/Check" |
  od -An -tu1 | awk '{ print ($NF == 1 ? "SERVING" : "not serving") }'
