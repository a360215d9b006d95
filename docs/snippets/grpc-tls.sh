# gRPC health check over TLS, wired by the profile's `tls`: the front's certificate is checked against the CA and
# the server name (no certificate names the node's address, so curl connects to CERBOS_PDP_ADDR while checking
# CERBOS_PDP_TLS_SERVER_NAME), and the client certificate is presented when the profile gives one.
port=${CERBOS_PDP_ADDR##*:}
host=${CERBOS_PDP_ADDR%:*}
client=()
if [ -n "${CERBOS_PDP_TLS_CERT:-}" ]; then
  client=(--cert "$CERBOS_PDP_TLS_CERT" --key "$CERBOS_PDP_TLS_KEY")
fi
printf '\0\0\0\0\0' |
  curl -sS --fail --http2 --cacert "$CERBOS_PDP_TLS_CA" "${client[@]}" \
    --connect-to "$CERBOS_PDP_TLS_SERVER_NAME:$port:$host:$port" \
    --data-binary @- -H 'Content-Type: application/grpc' -H 'TE: trailers' \
    "https://$CERBOS_PDP_TLS_SERVER_NAME:$port/grpc.health.v1.Health/Check" |
  od -An -tu1 | awk '{ print ($NF == 1 ? "SERVING" : "not serving") }'
