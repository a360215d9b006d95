{{/* The webhook's config file (ConfigMap pdp-injector-config, key config.yaml), with what the values set:
the default mode, the central Cerbos's address, the images, webhook.extraProfiles. */}}
{{- define "pdp.config" -}}
# pdp-injector configuration, mounted at /etc/pdp-injector/config.yaml from the ConfigMap pdp-injector-config.
#
# The webhook reloads this file when the ConfigMap changes (no restart). A file that does not parse, or that
# names an unknown key (keys are camelCase; unknown keys are errors, reported with their path), is refused and
# the last good config stays in force. An empty file means the built-in defaults shown here.

# Mode for Pods and namespaces that say `enabled`: daemonset (node-local PDP, needs the pdp-daemonset
# component), sidecar (a PDP container in each Pod), or central (the Service named by the default profile's
# central.address, which must then be set).
defaultMode: {{ .Values.pdp.model }}

# Profile for Pods without a pdp-injector.io/profile annotation. Built-in profiles: cerbos, flagd.
defaultProfile: cerbos

# true: also inject Pods that neither they nor their namespace opted in or out. Keep false unless every
# namespace the webhook sees should get a PDP (the Ignore webhook sees every namespace but the excluded ones).
injectByDefault: false

# The webhook's own namespace: never injected. Keep in sync with the install namespace.
webhookNamespace: pdp-system

# More namespaces never injected. kube-system, kube-public, kube-node-lease and webhookNamespace are always
# excluded and need not be listed.
excludedNamespaces: []

# Pod Security level assumed for a namespace without a pod-security.kubernetes.io/enforce label. In a
# namespace whose level is not privileged, daemonset mode drops the hostPath socket (keeps the TCP address)
# and says so in the admission warnings (reason downgraded_pss). baseline fails safe: where the cluster turns
# out to allow more, only the socket is lost; assuming privileged where the cluster enforces baseline would
# get the Pods rejected. To give a namespace the socket, label it pod-security.kubernetes.io/enforce=privileged.
defaultPodSecurityLevel: baseline

# The IP family of the nodes' addresses (status.hostIP, a node's first InternalIP): IPv4 | IPv6. Daemonset mode
# writes the address as $(CERBOS_PDP_HOST):3593 for IPv4 and [$(CERBOS_PDP_HOST)]:3593 for IPv6 (the kubelet
# cannot add the brackets itself). IPv6-only clusters set IPv6; dual-stack clusters set the family their nodes
# list first (kubectl get nodes -o jsonpath='{.items[*].status.addresses}'). Not needed with hostField:
# spec.nodeName (a DNS name), nor for sidecar mode (127.0.0.1, which a Pod's loopback has in every cluster) or
# central mode (write an IPv6 central.address in brackets). Sidecar args that build an address from the node IP
# themselves (flagd-sync below) must be written for the family too.
nodeAddressFamily: IPv4

# Only on clusters older than Kubernetes 1.29 (no native sidecars): the image of the init container
# pdp-injector-tools, which gives a classic sidecar its helper pdp-await (the PDP container waits for its own
# health check in a postStart hook, so the app starts after it, and in a Pod that runs to completion it stops
# once the app containers have ended). Default: the webhook's own image of the same version. Set it when the
# webhook's image is mirrored under another name.
toolsImage: {{ include "pdp.image" .Values.image }}

# Profiles. Built-in cerbos and flagd exist without this section; an entry with a built-in name overrides
# only the fields it sets. A new name starts from `extends: <profile>` or must set image, ports, health,
# envNames and socket. Fields:
#   extends            profile to start from (default: the built-in of the same name)
#   image              PDP image of the sidecar
#   imagePullPolicy    IfNotPresent | Always | Never
#   containerName      name of the sidecar container (its presence marks a Pod as already wired)
#   args, env          arguments and extra environment of the sidecar
#   ports              [{name, port}] the PDP listens on
#   addressPort        which of those ports the address variable points at
#   httpPort           which of them is the PDP's HTTP API, for envNames.httpAddress (cerbos: 3592; the node's
#                      front serves it too); unset: no HTTP address variable
#   health             {path, port}: HTTP endpoint for the sidecar's startup and readiness probes
#   resources          sidecar resources
#   securityContext    laid over the restricted baseline (non-root, no escalation, drop ALL, RuntimeDefault);
#                      the result must meet Pod Security restricted (no procMount Unmasked, SELinux type only
#                      container_t/container_init_t/container_kvm_t, no SELinux user or role, AppArmor only
#                      RuntimeDefault/Localhost, no Windows hostProcess, capabilities.add only NET_BIND_SERVICE)
#   envNames           {host, address, socket, port?, httpAddress?, tls?, tlsCa?, tlsServerName?, tlsCert?,
#                      tlsKey?}: variables app containers receive (cerbos: httpAddress CERBOS_PDP_HTTP_ADDR;
#                      an envNames without it gives no HTTP address variable). The tls* names default to the built-in profile's
#                      (cerbos: CERBOS_PDP_TLS, CERBOS_PDP_TLS_CA, CERBOS_PDP_TLS_SERVER_NAME, CERBOS_PDP_TLS_CERT,
#                      CERBOS_PDP_TLS_KEY; flagd: FLAGD_TLS, FLAGD_SERVER_CERT_PATH, FLAGD_TLS_SERVER_NAME,
#                      FLAGD_TLS_CERT_PATH, FLAGD_TLS_KEY_PATH); a profile that extends neither must name them
#   hostField          status.hostIP | spec.nodeName: where daemonset mode takes the node address from
#   socket             {dir, file}: the PDP's Unix socket (the hostPath directory in daemonset mode): a
#                      directory of its own, at least two levels deep (/var/run/cerbos), never a system, kubelet
#                      or container-runtime directory such as /var/run, /var/lib/kubelet, /run/containerd
#   sidecar            {placement: afterInit | first, native: bool, unixSocket: bool}; native: false (and
#                      every profile on clusters before 1.29) gives a classic container, first in containers,
#                      that the app waits for (postStart) and that ends with a Job's app (see toolsImage)
#   volumes            [{volume: <Kubernetes Volume>, mountPath}] mounted into the sidecar only; the volume
#                      is a configMap, secret, emptyDir, projected or downwardAPI (nothing that reaches the
#                      node or cluster storage)
#   tls                TLS on the TCP path, daemonset and central modes (sidecar mode talks to 127.0.0.1 in the
#                      Pod: no TLS wiring there; the node's Unix socket stays plaintext and local):
#                        secretName         Secret in the app's namespace as cert-manager writes it: ca.crt, and
#                                           tls.crt + tls.key for clientCertificate (only those keys are mounted)
#                        caConfigMap        ConfigMap in the app's namespace whose ca.crt is the server's CA, used
#                                           instead of the Secret's (whose ca.crt is then the client CA, never
#                                           trusted for the server); with it, secretName only for clientCertificate
#                        mountPath          default /var/run/pdp-injector/tls, read-only in every wired app
#                                           container (volume pdp-injector-tls); not over socket.dir
#                        serverName         required: the DNS name in the PDP's serving certificate (the address
#                                           is the node's IP, which no certificate names)
#                        clientCertificate  true: also the client certificate and key variables; default false
#                      App variables: <tls>=true, <tlsCa>=<mountPath>/ca.crt, <tlsServerName>=<serverName>, and
#                      with clientCertificate <tlsCert>=<mountPath>/tls.crt, <tlsKey>=<mountPath>/tls.key
#   mtls               {secretName, mountPath}: client TLS Secret mounted read-only into app containers, no
#                      variables (the older form; tls and mtls in one profile are refused: keep tls)
#   central            {address: host:port, httpAddress?: host:port}: the PDP's Service for central mode, for
#                      example cerbos.cerbos.svc.cluster.local:3593 (IPv6: [fd00::a]:3593). No default: without
#                      it, central mode is refused for the profile (no_central_address). httpAddress defaults
#                      to the host of address with httpPort
#   appEnv             [{name, value}]: fixed variables app containers also get (plain values only)
#   hostSocket         false: daemonset mode gives the TCP address only, never the node's socket (so that
#                      the profile can share a Pod with another that has one, as flagd-node); default true
#   awaitNode          in daemonset mode, a Pod whose socket does not come by CSI gets the init container
#                      pdp-injector-await, first of its own, which holds the app until its node's PDP answers
#                      health on the node (health.port must be httpPort); default true for cerbos, false
#                      elsewhere (docs/deployment-models.md, "Pods without the CSI volume")
#   fallback           true: daemonset-mode apps also get central.address as envNames.fallbackAddress
#                      (CERBOS_PDP_FALLBACK_ADDR, CERBOS_PDP_FALLBACK_HTTP_ADDR), to dial when the node's front
#                      refuses; needs central (docs/deployment-models.md, "Fallback to the central PDP")
#
# The daemonset-mode values of the cerbos profile (ports 3592/3593, socket /var/run/cerbos/cerbos.sock) must
# match the cerbos-pdp DaemonSet in templates/cerbos-node.
profiles:
  cerbos:
    {{- if include "pdp.central" . }}
    # The central Cerbos (the chart's pdp.central).
    central:
      address: {{ .Values.pdp.central.address | default "cerbos-pdp.pdp-central.svc:3593" }}
    {{- if and (include "pdp.node" .) .Values.pdp.nodeLocal.fallback }}
    # Daemonset-mode apps also get it as CERBOS_PDP_FALLBACK_ADDR (the chart's pdp.nodeLocal.fallback).
    fallback: true
    {{- end }}
    {{- end }}
    image: {{ include "pdp.image" .Values.pdp.cerbosImage }}
  # The node-local Cerbos over TLS with a client certificate (overlays/daemonset-tls, or components
  # pdp-front-tls + pdp-front-client-auth): Pods annotated pdp-injector.io/profile: cerbos-tls get the front's
  # CA from the ConfigMap pdp-node-ca (ca.crt) and their client certificate from the Secret pdp-tls (tls.crt,
  # tls.key; a cert-manager Certificate of the client CA) in their namespace, and the server name of the front's
  # certificate (docs/apps.md, "TLS on the TCP path"). The two CAs differ: a client certificate's issuer cannot
  # mint the front's name. Without either object such a Pod does not start (its volume cannot be mounted): it
  # never runs without the TLS it was configured for.
  cerbos-tls:
    extends: cerbos
    tls:
      secretName: pdp-tls
      caConfigMap: pdp-node-ca
      serverName: pdp-node-front.pdp-node.svc
      clientCertificate: true
  # The node-local Cerbos by a node-local Service (pdp.nodeLocal.service, Kubernetes 1.22+: Service
  # pdp-node-front with internalTrafficPolicy: Local), for clusters that forbid hostPort. Pods annotated
  # pdp-injector.io/inject: central and pdp-injector.io/profile: cerbos-node-service reach the front on their own
  # node by the Service's name (gRPC 3593, HTTP 3592). Without that component the name does not resolve.
  cerbos-node-service:
    extends: cerbos
    central:
      address: pdp-node-front.pdp-node.svc:3593
  # The node-local flagd of templates/flagd-node (overlays/flagd-node), three ways. Their ports must match that
  # component's front (flagd-node-front): evaluation on the node's port 8013, sync on 8015. TCP only
  # (hostSocket: false), so they work at every Pod Security level and next to the cerbos profile in one Pod
  # (two profiles with a node socket collide on its volume). The front's sockets, for Pods in privileged
  # namespaces: /var/run/flagd/flagd.sock (evaluation: the built-in flagd profile in daemonset mode) and
  # /var/run/flagd/sync.sock (flagd-in-process-socket below).
  # RPC: each evaluation is a gRPC call to the node's flagd. Mode daemonset.
  flagd-node:
    extends: flagd
    hostSocket: false
    appEnv:
      - {name: FLAGD_RESOLVER, value: rpc}
  # In-process: the OpenFeature provider syncs the flags from the node's flagd and evaluates them in the app.
  # FLAGD_PORT is the sync port (FLAGD_SYNC_PORT too, for providers that read that name). Mode daemonset.
  flagd-in-process:
    extends: flagd
    ports:
      - {name: flagd, port: 8013}
      - {name: flagd-mgmt, port: 8014}
      - {name: flagd-sync, port: 8015}
    addressPort: 8015
    hostSocket: false
    appEnv:
      - {name: FLAGD_RESOLVER, value: in-process}
      - {name: FLAGD_SYNC_PORT, value: "8015"}
  # In-process as the node-local Cerbos is reached: the front's sync socket where the namespace allows the
  # hostPath (privileged), its port 8015 elsewhere (downgraded_pss). Not combinable with cerbos in one Pod in
  # privileged namespaces (both mount a node socket). Mode daemonset.
  flagd-in-process-socket:
    extends: flagd-in-process
    hostSocket: true
    socket: {dir: /var/run/flagd, file: sync.sock}
  # The same socket in every namespace, by the CSI plugin's flagd profile where the namespace is not privileged
  # (the chart's pdp.flagSync adds that profile to the plugin; its node relay serves the socket). Mode daemonset.
  flagd-in-process-csi:
    extends: flagd-in-process
    hostSocket: true
    socket: {dir: /var/run/flagd, file: sync.sock}
    csiProfile: flagd
  # In-process from the central flag sync source (the chart's pdp.flagSync), for Pods that do not use their
  # node's relay: the source knows each caller by its Pod's address. Mode central.
  flagd-in-process-central:
    extends: flagd-in-process
    central:
      address: pdp-flag-sync.pdp-system.svc:8015
  # A flagd sidecar that syncs from the node's flagd over gRPC instead of reading a mounted ConfigMap: no flags
  # ConfigMap and no API access in the app's namespace. The app calls the sidecar on 127.0.0.1:8013. Mode sidecar.
  # These args are the profile's own, not rendered by nodeAddressFamily: on IPv6 nodes write
  # --uri=grpc://[$(FLAGD_NODE_HOST)]:8015.
  flagd-sync:
    extends: flagd
    args:
      - start
      - --port=8013
      - --management-port=8014
      - --uri=grpc://$(FLAGD_NODE_HOST):8015
    env:
      - name: FLAGD_NODE_HOST
        valueFrom:
          fieldRef: {apiVersion: v1, fieldPath: status.hostIP}
    volumes: []
{{- with .Values.webhook.extraProfiles }}
  # webhook.extraProfiles of the Helm chart.
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
