# gRPC health check of the PDP at CERBOS_PDP_ADDR with nothing but curl: gRPC is HTTP/2, in cleartext here. The
# request is an empty HealthCheckRequest (5 zero bytes: no compression, length 0); the last byte of the answer is
# the status, 1 = SERVING.
printf '\0\0\0\0\0' |
  curl -sS --fail --http2-prior-knowledge --data-binary @- \
    -H 'Content-Type: application/grpc' -H 'TE: trailers' \
    "http://$CERBOS_PDP_ADDR/grpc.health.v1.Health/Check" |
  od -An -tu1 | awk '{ print ($NF == 1 ? "SERVING" : "not serving") }'
