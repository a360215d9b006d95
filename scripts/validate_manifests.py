#!/usr/bin/env python3
"""The structural checks of scripts/validate-manifests.sh on one rendered overlay (a directory of documents):
`split`, `refs`, `cel`, `configs`, `wiring` (see the shell script's header for what each checks). PyYAML comes
with kubernetes-validate, which the shell script installs."""
import os, re, subprocess, sys
import yaml

CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration", "PriorityClass", "CSIDriver", "CustomResourceDefinition", "ClusterIssuer",
    "StorageClass", "RuntimeClass", "PersistentVolume", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
ISSUER_TYPES = ("selfSigned", "ca", "acme", "vault", "venafi")
SAN_FIELDS = ("dnsNames", "ipAddresses", "uris", "emailAddresses", "commonName", "otherNames")


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def ident(d):
    m = d.get("metadata") or {}
    ns = m.get("namespace")
    return f"{d.get('kind')}/{(ns + '/') if ns else ''}{m.get('name')}"


def split(outdir):
    """Writes one file per Kubernetes document into outdir/k8s, checks cert-manager documents in place,
    prints 'total k8s certmanager' on stdout and problems on stderr; exit 1 on any problem."""
    docs = load(os.path.join(outdir, "rendered.yaml"))
    errors, seen = [], set()
    k8s, cm, of = [], [], []
    for i, d in enumerate(docs):
        for field in ("apiVersion", "kind"):
            if not d.get(field):
                errors.append(f"document {i}: no {field}")
        if not (d.get("metadata") or {}).get("name"):
            errors.append(f"document {i} ({d.get('kind')}): no metadata.name")
            continue
        key = (d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else "", d["kind"], ident(d))
        if key in seen:
            errors.append(f"{ident(d)}: appears twice")
        seen.add(key)
        if d["kind"] not in CLUSTER_SCOPED and not d["metadata"].get("namespace"):
            errors.append(f"{ident(d)}: namespaced object without metadata.namespace")
        if d["kind"] in CLUSTER_SCOPED and d["metadata"].get("namespace"):
            errors.append(f"{ident(d)}: cluster-scoped object with a namespace")
        if d["apiVersion"].split("/")[0].endswith("cert-manager.io"):
            cm.append(d)
        elif d["apiVersion"].split("/")[0] == "core.openfeature.dev":
            of.append(d)
        else:
            k8s.append(d)
    os.makedirs(os.path.join(outdir, "k8s"), exist_ok=True)
    for i, d in enumerate(k8s):
        name = re.sub(r"[^A-Za-z0-9.-]", "_", f"{i:03d}-{d['kind']}-{d['metadata']['name']}")
        with open(os.path.join(outdir, "k8s", name + ".yaml"), "w") as f:
            yaml.safe_dump(d, f, sort_keys=False)
    errors += check_cert_manager(cm, docs)
    errors += check_featureflags(of, docs)
    for e in errors:
        print(f"  error: {e}", file=sys.stderr)
    print(len(docs), len(k8s), len(cm) + len(of))
    return 1 if errors else 0


def check_featureflags(of, docs):
    """FeatureFlag objects (core.openfeature.dev, no schema in kubernetes-validate), as flagd v0.12.9's Kubernetes
    sync reads them: v1beta1, spec.flagSpec.flags, each flag with state ENABLED|DISABLED, variants (an object)
    and a defaultVariant among them; and every flagd --uri=core.openfeature.dev/<ns>/<name> of the overlay
    names one of them."""
    errors, names = [], set()
    for d in of:
        where = ident(d)
        if d["apiVersion"] != "core.openfeature.dev/v1beta1" or d["kind"] != "FeatureFlag":
            errors.append(f"{where}: {d['apiVersion']} {d['kind']} (expected core.openfeature.dev/v1beta1 FeatureFlag)")
            continue
        names.add((d["metadata"].get("namespace"), d["metadata"]["name"]))
        flags = ((d.get("spec") or {}).get("flagSpec") or {}).get("flags")
        if not isinstance(flags, dict) or not flags:
            errors.append(f"{where}: spec.flagSpec.flags must be a non-empty object")
            continue
        unknown = set((d["spec"]["flagSpec"])) - {"flags", "$evaluators"}
        if unknown:
            errors.append(f"{where}: unknown spec.flagSpec fields {sorted(unknown)}")
        for key, flag in flags.items():
            if not isinstance(flag, dict):
                errors.append(f"{where}: flag {key} is not an object")
                continue
            if flag.get("state") not in ("ENABLED", "DISABLED"):
                errors.append(f"{where}: flag {key}: state {flag.get('state')!r} (ENABLED or DISABLED)")
            variants = flag.get("variants")
            if not isinstance(variants, dict) or not variants:
                errors.append(f"{where}: flag {key}: variants must be a non-empty object")
            elif flag.get("defaultVariant") not in variants:
                errors.append(f"{where}: flag {key}: defaultVariant {flag.get('defaultVariant')!r} is not a variant")
    prefix = "--uri=core.openfeature.dev/"
    for d in docs:
        if d.get("kind") != "DaemonSet":
            continue
        for c in d["spec"]["template"]["spec"].get("containers", []):
            for a in c.get("args") or []:
                if a.startswith(prefix):
                    ns, _, name = a[len(prefix):].partition("/")
                    if (ns, name) not in names:
                        errors.append(f"{ident(d)}: {a} names no FeatureFlag of the overlay")
    return errors


def check_cert_manager(cm, docs):
    errors = []
    issuers = {}
    certs = {}
    for d in cm:
        where = ident(d)
        if d["apiVersion"] != "cert-manager.io/v1":
            errors.append(f"{where}: apiVersion {d['apiVersion']} (expected cert-manager.io/v1)")
        spec = d.get("spec")
        if not isinstance(spec, dict):
            errors.append(f"{where}: no spec")
            continue
        ns = d["metadata"].get("namespace")
        if d["kind"] in ("Issuer", "ClusterIssuer"):
            types = [t for t in ISSUER_TYPES if t in spec]
            if len(types) != 1:
                errors.append(f"{where}: needs exactly one of {', '.join(ISSUER_TYPES)}, has {types or 'none'}")
            if "ca" in spec and not (spec["ca"] or {}).get("secretName"):
                errors.append(f"{where}: spec.ca.secretName is required")
            unknown = set(spec) - set(ISSUER_TYPES)
            if unknown:
                errors.append(f"{where}: unknown spec fields {sorted(unknown)}")
            issuers[(d["kind"], ns if d["kind"] == "Issuer" else None, d["metadata"]["name"])] = d
        elif d["kind"] == "Certificate":
            if not spec.get("secretName"):
                errors.append(f"{where}: spec.secretName is required")
            ref = spec.get("issuerRef") or {}
            if not ref.get("name"):
                errors.append(f"{where}: spec.issuerRef.name is required")
            if ref.get("kind", "Issuer") not in ("Issuer", "ClusterIssuer") or ref.get("group", "cert-manager.io") != "cert-manager.io":
                errors.append(f"{where}: issuerRef must be a cert-manager.io Issuer or ClusterIssuer")
            if not any(spec.get(f) for f in SAN_FIELDS):
                errors.append(f"{where}: needs at least one of {', '.join(SAN_FIELDS)}")
            for name in spec.get("dnsNames") or []:
                if not re.fullmatch(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name):
                    errors.append(f"{where}: dnsNames entry {name!r} is not a DNS name")
            pk = spec.get("privateKey") or {}
            if pk.get("algorithm", "RSA") not in ("RSA", "ECDSA", "Ed25519"):
                errors.append(f"{where}: privateKey.algorithm {pk.get('algorithm')!r}")
            certs[(ns, d["metadata"]["name"])] = d
        else:
            errors.append(f"{where}: unexpected cert-manager kind (only Certificate, Issuer, ClusterIssuer are checked)")
    # References must resolve inside the overlay (a ClusterIssuer may live outside it).
    for (ns, name), d in certs.items():
        ref = d["spec"].get("issuerRef") or {}
        kind = ref.get("kind", "Issuer")
        if kind == "Issuer" and ("Issuer", ns, ref.get("name")) not in issuers:
            errors.append(f"{ident(d)}: issuerRef Issuer {ns}/{ref.get('name')} is not in the overlay")
    secrets_issued = {(ns, d["spec"].get("secretName")) for (ns, _), d in certs.items()}
    for (kind, ns, name), d in issuers.items():
        ca = d["spec"].get("ca")
        if ca and kind == "Issuer" and (ns, ca.get("secretName")) not in secrets_issued:
            errors.append(f"{ident(d)}: CA Secret {ns}/{ca.get('secretName')} is issued by no Certificate in the overlay")
    # A server certificate comes from a namespaced Issuer whose CA no ClusterIssuer signs with: whoever may
    # create a Certificate naming a ClusterIssuer (any namespace) must not be able to mint a server's name
    # (SECURITY.md, the front's two CAs).
    cluster_cas = {(d["spec"].get("ca") or {}).get("secretName") for (kind, _, _), d in issuers.items()
                   if kind == "ClusterIssuer"}
    for (ns, name), d in certs.items():
        if "server auth" not in (d["spec"].get("usages") or []):
            continue
        ref = d["spec"].get("issuerRef") or {}
        if ref.get("kind", "Issuer") != "Issuer":
            errors.append(f"{ident(d)}: a server certificate issued by ClusterIssuer {ref.get('name')}: anyone who "
                          "may name that ClusterIssuer can mint this name; use a namespaced Issuer")
            continue
        issuer = issuers.get(("Issuer", ns, ref.get("name")))
        ca = ((issuer or {}).get("spec") or {}).get("ca") or {}
        if ca.get("secretName") and ns == "cert-manager" and ca.get("secretName") in cluster_cas:
            errors.append(f"{ident(d)}: its Issuer signs with the CA of a ClusterIssuer")
    for d in docs:
        ann = (d.get("metadata") or {}).get("annotations") or {}
        ref = ann.get("cert-manager.io/inject-ca-from")
        if ref:
            ns, _, name = ref.partition("/")
            if (ns, name) not in certs:
                errors.append(f"{ident(d)}: cert-manager.io/inject-ca-from {ref} names no Certificate in the overlay")
        if d.get("kind") == "Deployment" and certs:
            ns = d["metadata"].get("namespace")
            for v in d["spec"]["template"]["spec"].get("volumes") or []:
                secret = (v.get("secret") or {}).get("secretName")
                if secret and (ns, secret) not in secrets_issued:
                    errors.append(f"{ident(d)}: mounts Secret {secret}, which no Certificate in the overlay issues")
    return errors


def configs(outdir):
    """Writes the pdp-injector config.yaml of the overlay to outdir/config.yaml."""
    for d in load(os.path.join(outdir, "rendered.yaml")):
        if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "pdp-injector-config":
            text = (d.get("data") or {}).get("config.yaml")
            if text is None:
                print("  error: ConfigMap pdp-injector-config has no key config.yaml", file=sys.stderr)
                return 1
            with open(os.path.join(outdir, "config.yaml"), "w") as f:
                f.write(text)
            return 0
    print("  error: no ConfigMap pdp-injector-config", file=sys.stderr)
    return 1


def wiring(outdir, binary):
    """Injects a sample opted-in Pod with the overlay's config and follows its wiring through the overlay: the
    address and socket it gets are the front's (pdp-node-front: hostPort, stable socket in a hostPath), and the
    front's instance sockets are where the cerbos-pdp DaemonSet's Cerbos listens (per Pod, ${POD_NAME}, in a
    hostPath both mount). Prints a one-line summary."""
    docs = load(os.path.join(outdir, "rendered.yaml"))
    by_name = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "DaemonSet"}
    if "cerbos-pdp" not in by_name:
        print("no DaemonSet in this overlay, wiring not compared")
        return 0
    errors = []
    front = by_name.get("pdp-node-front")
    if not front:
        print("  error: cerbos-pdp without the front DaemonSet pdp-node-front", file=sys.stderr)
        return 1
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "wiring-check", "namespace": "demo",
                     "annotations": {"pdp-injector.io/inject": "daemonset"}},
        "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]},
    }
    # The node's socket is a hostPath, mounted only where Pod Security allows it: the namespace says privileged
    # (an unlabelled one counts as the config's defaultPodSecurityLevel, baseline, and gets TCP only).
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": "demo", "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}
    res = subprocess.run([binary, "inject", "--config", os.path.join(outdir, "config.yaml"), "-f", "-"],
                         input=yaml.safe_dump_all([namespace, pod]), capture_output=True, text=True)
    if res.returncode != 0:
        print(f"  error: pdp-injector inject failed: {res.stderr.strip()}", file=sys.stderr)
        return 1
    out = [d for d in yaml.safe_load_all(res.stdout) if d and d.get("kind") == "Pod"][0]
    app = out["spec"]["containers"][0]
    env = {e["name"]: e for e in app.get("env") or []}

    def host_paths(ds):
        spec = ds["spec"]["template"]["spec"]
        return {v["hostPath"]["path"].rstrip("/") for v in spec.get("volumes") or [] if v.get("hostPath")}
    fspec = front["spec"]["template"]["spec"]
    fc = fspec["containers"][0]
    args = dict(a[2:].split("=", 1) for a in fc.get("args") or [] if a.startswith("--") and "=" in a)
    if (fc.get("args") or [None])[0] != "node-proxy":
        errors.append(f"pdp-node-front does not run node-proxy: args {fc.get('args')}")
    host_ports = {p.get("hostPort") for p in fc.get("ports") or [] if p.get("hostPort")}
    addr = (env.get("CERBOS_PDP_ADDR") or {}).get("value", "")
    port = addr.rsplit(":", 1)[-1] if ":" in addr else ""
    if not port.isdigit() or int(port) not in host_ports:
        errors.append(f"CERBOS_PDP_ADDR={addr!r} does not point at a hostPort of pdp-node-front {sorted(host_ports)}")
    # The HTTP address: the front's HTTP port (--http-port), published as a hostPort of its own.
    http_addr = (env.get("CERBOS_PDP_HTTP_ADDR") or {}).get("value", "")
    http_port = http_addr.rsplit(":", 1)[-1] if ":" in http_addr else ""
    if not http_port.isdigit() or int(http_port) not in host_ports or args.get("http-port") != http_port:
        errors.append(f"CERBOS_PDP_HTTP_ADDR={http_addr!r} is not the front's --http-port={args.get('http-port')!r} "
                      f"published as a hostPort {sorted(host_ports)}")
    elif http_port == port:
        errors.append(f"CERBOS_PDP_HTTP_ADDR and CERBOS_PDP_ADDR are the same port {port}")
    sock = (env.get("CERBOS_PDP_SOCKET") or {}).get("value", "")
    if os.path.dirname(sock) not in host_paths(front):
        errors.append(f"CERBOS_PDP_SOCKET={sock!r} is not in a hostPath of pdp-node-front {sorted(host_paths(front))}")
    if args.get("socket") != sock:
        errors.append(f"the front serves --socket={args.get('socket')!r}, apps get CERBOS_PDP_SOCKET={sock!r}")
    instances = args.get("instances", "").rstrip("/")
    pdp = by_name["cerbos-pdp"]
    for name, ds in (("pdp-node-front", front), ("cerbos-pdp", pdp)):
        if instances not in host_paths(ds):
            errors.append(f"the front's --instances={instances!r} is not a hostPath of {name}")
    if instances in host_paths(pdp) and os.path.dirname(sock) == instances:
        errors.append("the instance sockets share the apps' socket directory")
    pdp_env = {e["name"]: e for e in pdp["spec"]["template"]["spec"]["containers"][0].get("env") or []}
    if (pdp_env.get("POD_NAME", {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") != "metadata.name":
        errors.append("cerbos-pdp has no POD_NAME from metadata.name (its sockets are named after its Pod)")
    cerbos_conf = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "cerbos-pdp-config"]
    if cerbos_conf:
        server = yaml.safe_load(cerbos_conf[0]["data"]["config.yaml"]).get("server", {})
        want = {"grpcListenAddr": f"unix:{instances}/${{POD_NAME}}{args.get('tcp-backend', '.grpc.sock')}",
                "httpListenAddr": f"unix:{instances}/${{POD_NAME}}{args.get('socket-backend', '.http.sock')}"}
        for key, value in want.items():
            if server.get(key) != value:
                errors.append(f"Cerbos {key} is {server.get(key)!r}, the front forwards to {value!r}")
    else:
        errors.append("no ConfigMap cerbos-pdp-config")
    for e in errors:
        print(f"  error: {e}", file=sys.stderr)
    if not errors:
        print(f"injected Pod: CERBOS_PDP_ADDR={addr}, CERBOS_PDP_HTTP_ADDR={http_addr}, CERBOS_PDP_SOCKET={sock}; "
              f"the front forwards them to {instances}/<pod>{args.get('tcp-backend')} and (both HTTP ones) "
              f"<pod>{args.get('socket-backend')}, where cerbos-pdp listens")
    return 1 if errors else 0


SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical", "system-node-critical"}


def refs(outdir):
    """References that the schema cannot check: a Pod template's priorityClassName names a PriorityClass of the
    overlay (or a system one), a ValidatingAdmissionPolicyBinding names a policy of the overlay and denies, a
    NetworkPolicy selects the Pods of a workload in its namespace and opens only ports those Pods listen on."""
    docs = load(os.path.join(outdir, "rendered.yaml"))
    errors, notes = [], []
    classes = {d["metadata"]["name"] for d in docs if d.get("kind") == "PriorityClass"}
    for d in docs:
        pc = ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("priorityClassName")
        if pc and pc not in classes | SYSTEM_PRIORITY_CLASSES:
            errors.append(f"{ident(d)}: priorityClassName {pc} is no PriorityClass of the overlay")
    for d in docs:
        if d.get("kind") == "PriorityClass":
            v = d.get("value", 0)
            if not 0 < v <= 1000000000:
                errors.append(f"{ident(d)}: value {v} (user-defined classes: at most 1000000000)")
            if d.get("globalDefault"):
                errors.append(f"{ident(d)}: globalDefault would give every Pod of the cluster this class")
    policies = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ValidatingAdmissionPolicy"}
    bound = set()
    for d in docs:
        if d.get("kind") == "ValidatingAdmissionPolicyBinding":
            name = d["spec"].get("policyName")
            if name not in policies:
                errors.append(f"{ident(d)}: policyName {name} is no ValidatingAdmissionPolicy of the overlay")
            if "Deny" not in (d["spec"].get("validationActions") or []):
                errors.append(f"{ident(d)}: validationActions without Deny")
            bound.add(name)
    for name in policies:
        if name not in bound:
            errors.append(f"ValidatingAdmissionPolicy/{name}: no binding, so it is never enforced")
    pods = []  # (namespace, labels, container ports)
    for d in docs:
        tmpl = (d.get("spec") or {}).get("template")
        if d.get("kind") in ("Deployment", "DaemonSet", "StatefulSet") and tmpl:
            ports = {(p.get("protocol", "TCP"), p["containerPort"]) for c in tmpl["spec"].get("containers", [])
                     for p in c.get("ports") or []}
            pods.append((d["metadata"]["namespace"], (tmpl.get("metadata") or {}).get("labels") or {}, ports, ident(d)))
    for d in docs:
        if d.get("kind") != "NetworkPolicy":
            continue
        ns = d["metadata"]["namespace"]
        sel = d["spec"].get("podSelector") or {}
        if sel.get("matchExpressions"):
            errors.append(f"{ident(d)}: podSelector.matchExpressions is not checked by this script")
            continue
        want = sel.get("matchLabels") or {}
        selected = [p for p in pods if p[0] == ns and all(p[1].get(k) == v for k, v in want.items())]
        if not selected:
            errors.append(f"{ident(d)}: podSelector {want} selects no Pod of the overlay in {ns}")
            continue
        listening = set().union(*(p[2] for p in selected))
        for rule in d["spec"].get("ingress") or []:
            for port in rule.get("ports") or []:
                key = (port.get("protocol", "TCP"), port.get("port"))
                if key not in listening:
                    errors.append(f"{ident(d)}: ingress port {key} is not a port of {', '.join(p[3] for p in selected)}")
        notes.append(f"{ident(d)} selects {', '.join(p[3] for p in selected)}")
    # A Service selects the Pods of a workload in its namespace, its target ports are named ports of theirs, and
    # the node-local one stays on the node; the profile that names it points at one of its ports.
    named_ports = {}
    for d in docs:
        tmpl = (d.get("spec") or {}).get("template")
        if d.get("kind") in ("Deployment", "DaemonSet", "StatefulSet") and tmpl:
            named_ports[ident(d)] = {p.get("name"): p["containerPort"] for c in tmpl["spec"].get("containers", [])
                                     for p in c.get("ports") or [] if p.get("name")}
    config = [d for d in docs if d.get("kind") == "ConfigMap" and "config.yaml" in (d.get("data") or {})
              and d["metadata"]["name"].startswith("pdp-injector-config")]
    profiles = yaml.safe_load(config[0]["data"]["config.yaml"]).get("profiles", {}) if config else {}
    for d in docs:
        if d.get("kind") != "Service" or d["metadata"].get("namespace") != "pdp-node":
            continue
        ns, want = d["metadata"]["namespace"], d["spec"].get("selector") or {}
        selected = [p for p in pods if p[0] == ns and want and all(p[1].get(k) == v for k, v in want.items())]
        if not selected:
            errors.append(f"{ident(d)}: selector {want} selects no Pod of the overlay in {ns}")
            continue
        for port in d["spec"].get("ports") or []:
            target = port.get("targetPort", port["port"])
            if not all(target in named_ports.get(p[3], {}) or target in named_ports.get(p[3], {}).values()
                       for p in selected):
                errors.append(f"{ident(d)}: targetPort {target} is no port of {', '.join(p[3] for p in selected)}")
        if d["spec"].get("internalTrafficPolicy") != "Local":
            errors.append(f"{ident(d)}: internalTrafficPolicy is not Local (connections would leave the node)")
        host = f"{d['metadata']['name']}.{ns}.svc"
        users = [n for n, pr in profiles.items() if str((pr.get("central") or {}).get("address", "")).startswith(host + ":")]
        ports = {str(p["port"]) for p in d["spec"].get("ports") or []}
        for n in users:
            if profiles[n]["central"]["address"].rsplit(":", 1)[1] not in ports:
                errors.append(f"profile {n}: {profiles[n]['central']['address']} is no port of {ident(d)}")
        if not users:
            errors.append(f"{ident(d)}: no profile of the config points at {host}")
        notes.append(f"{ident(d)} selects {', '.join(p[3] for p in selected)}, stays on the node, profile "
                     f"{', '.join(users)} points at it")
    for e in errors:
        print(f"  error: {e}", file=sys.stderr)
    print("; ".join(notes) if notes else "no NetworkPolicy")
    return 1 if errors else 0


# --- The ValidatingAdmissionPolicy guarding the webhook's own registration, evaluated offline. -----------------

GUARD_USER = "system:serviceaccount:pdp-system:pdp-injector"
CEL_VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject", "authorizer", "variables")


def defaulted(mwc):
    """The MutatingWebhookConfiguration as the apiserver stores it: defaults filled in, server metadata added,
    a caBundle already patched in."""
    import copy
    o = copy.deepcopy(mwc)
    o["metadata"].update({"uid": "0f5d0c1e-0000-4000-8000-000000000001", "resourceVersion": "100",
                          "generation": 2, "creationTimestamp": "2026-01-01T00:00:00Z",
                          "managedFields": [{"manager": "kubectl", "operation": "Apply"}]})
    for w in o.get("webhooks") or []:
        w.setdefault("failurePolicy", "Fail")
        w.setdefault("matchPolicy", "Equivalent")
        w.setdefault("namespaceSelector", {})
        w.setdefault("objectSelector", {})
        w.setdefault("reinvocationPolicy", "Never")
        w.setdefault("timeoutSeconds", 10)
        for r in w.get("rules") or []:
            r.setdefault("scope", "*")
        svc = (w.get("clientConfig") or {}).get("service")
        if svc is not None:
            svc.setdefault("port", 443)
        w["clientConfig"]["caBundle"] = "T0xEIENB"
    return o


def mutations(value):
    """Different values of the same shape (and absence, as None)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1]
    if isinstance(value, str):
        return [value + "x"]
    if isinstance(value, list):
        out = [value + [value[0] if value else "x"]]
        if value:
            out.append(value[:-1])
        if len(value) > 1:
            out.append(list(reversed(value)))
        return out
    if isinstance(value, dict):
        return [dict(value, extra={"matchLabels": {"x": "y"}}), {}] if value else [{"matchLabels": {"x": "y"}}]
    return ["x"]


def guard_cases(old):
    """(name, user, operation, object name, new object, allowed?)"""
    import copy
    cases = []

    def new(change):
        o = copy.deepcopy(old)
        change(o)
        return o

    def rotate(o):
        for w in o["webhooks"]:
            w["clientConfig"]["caBundle"] = "TkVXIENB"
        o["metadata"]["resourceVersion"] = "101"
        o["metadata"]["managedFields"] = [{"manager": "pdp-injector", "operation": "Update"}]
    cases.append(("caBundle rotated in every webhook (with new resourceVersion, managedFields)", GUARD_USER, "UPDATE", rotate, True))
    cases.append(("caBundle of one webhook", GUARD_USER, "UPDATE",
                  lambda o: o["webhooks"][0]["clientConfig"].update(caBundle="TkVXIENB"), True))
    cases.append(("nothing changed", GUARD_USER, "UPDATE", lambda o: None, True))
    for i, w in enumerate(old["webhooks"]):
        keys = sorted(set(w) | {"matchConditions", "objectSelector", "rules"})
        for key in keys:
            if key in ("name", "clientConfig"):
                continue
            values = mutations(w[key]) if key in w else [[{"name": "x", "expression": "true"}] if key == "matchConditions" else {"matchLabels": {"x": "y"}}]
            for n, v in enumerate(values):
                def change(o, i=i, key=key, v=v):
                    o["webhooks"][i][key] = copy.deepcopy(v)
                cases.append((f"webhooks[{i}].{key} changed ({n})", GUARD_USER, "UPDATE", change, False))
            if key in w:
                cases.append((f"webhooks[{i}].{key} removed", GUARD_USER, "UPDATE",
                              lambda o, i=i, key=key: o["webhooks"][i].pop(key), False))
        cc = w["clientConfig"]
        if "service" in cc:
            for f in ("name", "namespace", "path", "port"):
                cases.append((f"webhooks[{i}].clientConfig.service.{f} changed", GUARD_USER, "UPDATE",
                              lambda o, i=i, f=f: o["webhooks"][i]["clientConfig"]["service"].update(
                                  {f: mutations(cc["service"].get(f, "x"))[0]}), False))
            cases.append((f"webhooks[{i}].clientConfig: url instead of service", GUARD_USER, "UPDATE",
                          lambda o, i=i: o["webhooks"][i].update(clientConfig={
                              "url": "https://evil.example.invalid/mutate", "caBundle": "TkVXIENB"}), False))
            cases.append((f"webhooks[{i}].clientConfig: url added", GUARD_USER, "UPDATE",
                          lambda o, i=i: o["webhooks"][i]["clientConfig"].update(url="https://evil.example.invalid/"), False))
        cases.append((f"webhooks[{i}].name changed", GUARD_USER, "UPDATE",
                      lambda o, i=i: o["webhooks"][i].update(name="other.example.io"), False))
        cases.append((f"webhooks[{i}] removed", GUARD_USER, "UPDATE", lambda o, i=i: o["webhooks"].pop(i), False))
    cases.append(("a webhook added", GUARD_USER, "UPDATE",
                  lambda o: o["webhooks"].append(dict(copy.deepcopy(o["webhooks"][0]), name="extra.example.io")), False))
    cases.append(("webhooks reordered", GUARD_USER, "UPDATE", lambda o: o["webhooks"].reverse(), len(old["webhooks"]) < 2))
    cases.append(("all webhooks removed", GUARD_USER, "UPDATE", lambda o: o.pop("webhooks"), False))
    for field, value in (("labels", {"x": "y"}), ("annotations", {"x": "y"}),
                         ("ownerReferences", [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "1"}]),
                         ("finalizers", ["example.io/block"])):
        cases.append((f"metadata.{field} added to", GUARD_USER, "UPDATE",
                      lambda o, field=field, value=value: o["metadata"].update(
                          {field: (dict(o["metadata"].get(field) or {}, **value) if isinstance(value, dict) else value)}), False))
        if field in old["metadata"]:
            cases.append((f"metadata.{field} removed", GUARD_USER, "UPDATE",
                          lambda o, field=field: o["metadata"].pop(field), False))
    # Other users, other objects, other operations: the policy does not apply.
    weaken = lambda o: [w.update(failurePolicy="Ignore") for w in o["webhooks"]]
    for user in ("kubernetes-admin", "system:serviceaccount:cert-manager:cert-manager-cainjector",
                 "system:serviceaccount:pdp-system:default", "system:serviceaccount:other:pdp-injector"):
        cases.append((f"{user} weakens failurePolicy", user, "UPDATE", weaken, True))
    out = []
    for name, user, op, change, allowed in cases:
        out.append((name, user, op, old["metadata"]["name"], new(change), allowed))
    out.append(("the ServiceAccount updates another configuration", GUARD_USER, "UPDATE", "someone-else",
                new(weaken), True))
    return out


def cel_guard(outdir):
    """Evaluates each ValidatingAdmissionPolicy on the MutatingWebhookConfiguration pdp-injector with a CEL
    implementation (cel-expr-python, the CEL C++ runtime, with the optional-types extension that Kubernetes
    enables) against updates the webhook's ServiceAccount may and may not make."""
    docs = load(os.path.join(outdir, "rendered.yaml"))
    policies = [d for d in docs if d.get("kind") == "ValidatingAdmissionPolicy"]
    mwc = [d for d in docs if d.get("kind") == "MutatingWebhookConfiguration" and d["metadata"]["name"] == "pdp-injector"]
    if not policies:
        print("no ValidatingAdmissionPolicy in this overlay")
        return 0
    pod_policies = [d for d in policies if d["metadata"]["name"] in POD_POLICIES]
    secret_policies = [d for d in policies if d["metadata"]["name"] in SECRET_POLICIES]
    policies = [d for d in policies if d["metadata"]["name"] not in POD_POLICIES
                and d["metadata"]["name"] not in SECRET_POLICIES]
    if policies and not mwc:
        print("  error: a ValidatingAdmissionPolicy but no MutatingWebhookConfiguration pdp-injector", file=sys.stderr)
        return 1
    from cel_expr_python import cel
    from cel_expr_python.ext.ext_optional import ExtOptional
    env = cel.NewEnv(variables={v: cel.Type.DYN for v in CEL_VARIABLES}, extensions=[ExtOptional()])
    errors = []

    def compiled(expr, where):
        try:
            return env.compile(expr)
        except Exception as e:  # a compile error is a policy the apiserver would refuse
            errors.append(f"{where}: does not compile: {e}")
            return None

    def matches(spec, op, group, version, resource, name):
        for r in (spec.get("matchConstraints") or {}).get("resourceRules") or []:
            if (op in r.get("operations", []) or "*" in r.get("operations", [])) \
                    and group in r.get("apiGroups", []) and (version in r.get("apiVersions", []) or "*" in r.get("apiVersions", [])) \
                    and resource in r.get("resources", []) \
                    and (not r.get("resourceNames") or name in r["resourceNames"]):
                return True
        return False

    def prepare(policy):
        """The policy's compiled match conditions, variables and validations (None when one does not compile)."""
        spec = policy["spec"]
        pname = policy["metadata"]["name"]
        if spec.get("failurePolicy", "Fail") != "Fail":
            errors.append(f"{pname}: failurePolicy is not Fail")
        conds = [(c["name"], compiled(c["expression"], f"{pname} matchCondition {c['name']}")) for c in spec.get("matchConditions") or []]
        variables = [(v["name"], compiled(v["expression"], f"{pname} variable {v['name']}")) for v in spec.get("variables") or []]
        checks = [(c.get("message", c["expression"]), compiled(c["expression"], f"{pname} validation {n}"))
                  for n, c in enumerate(spec.get("validations") or [])]
        return None if errors else (conds, variables, checks)

    def run(compiled_policy, data):
        """The denial messages of one request (none: allowed); an evaluation error denies (failurePolicy Fail)."""
        conds, variables, checks = compiled_policy
        denied = []
        try:
            if all(expr.eval(data=data).plain_value() is True for _, expr in conds):
                for vname, expr in variables:
                    data["variables"][vname] = expr.eval(data=data).plain_value()
                for message, expr in checks:
                    result = expr.eval(data=data).plain_value()
                    if result is not True:
                        denied.append(message if result is False else f"evaluation error: {result}")
        except Exception as e:  # failurePolicy Fail: an error denies
            denied.append(f"evaluation error: {e}")
        return denied

    def creations(selected, table, resource, kind):
        """Evaluates policies on CREATE of `resource` against their cases; returns how many were evaluated."""
        total = 0
        for policy in selected:
            spec = policy["spec"]
            pname = policy["metadata"]["name"]
            ready = prepare(policy)
            if ready is None:
                break
            if not matches(spec, "CREATE", "", "v1", resource, ""):
                errors.append(f"{pname}: does not match CREATE of {kind}s")
                continue
            for case, user, ns, obj, want in table[pname]():
                total += 1
                data = {"object": obj, "oldObject": None, "params": None, "namespaceObject": None, "authorizer": None,
                        "request": {"operation": "CREATE", "namespace": ns, "name": obj["metadata"].get("name", ""),
                                    "userInfo": {"username": user},
                                    "kind": {"group": "", "version": "v1", "kind": kind}},
                        "variables": {}}
                denied = run(ready, data)
                if (not denied) != want:
                    errors.append(f"{pname}: {case}: {'denied' if denied else 'allowed'}, expected "
                                  f"{'allowed' if want else 'denied'}{(': ' + '; '.join(denied)[:200]) if denied else ''}")
        return total

    pod_total = creations(pod_policies, POD_POLICIES, "pods", "Pod")
    secret_total = creations(secret_policies, SECRET_POLICIES, "secrets", "Secret")

    old = defaulted(mwc[0]) if mwc else None
    total = 0
    for policy in policies:
        spec = policy["spec"]
        pname = policy["metadata"]["name"]
        ready = prepare(policy)
        if ready is None:
            break
        if not matches(spec, "UPDATE", "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", "pdp-injector"):
            errors.append(f"{pname}: does not match UPDATE of the MutatingWebhookConfiguration pdp-injector")
            continue
        for case, user, op, name, new, want in guard_cases(old):
            total += 1
            data = {"object": new, "oldObject": old, "params": None, "namespaceObject": None, "authorizer": None,
                    "request": {"operation": op, "name": name, "userInfo": {"username": user, "groups": ["system:authenticated"]},
                                "kind": {"group": "admissionregistration.k8s.io", "version": "v1", "kind": "MutatingWebhookConfiguration"}},
                    "variables": {}}
            matched = matches(spec, op, "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", name)
            denied = run(ready, data) if matched else []
            if (not denied) != want:
                why = "; ".join(denied)[:200]
                errors.append(f"{pname}: {case} by {user}: {'denied' if denied else 'allowed'}, expected "
                              f"{'allowed' if want else 'denied'}{(': ' + why) if why else ''}")
    for e in errors:
        print(f"  error: {e}", file=sys.stderr)
    if not errors:
        said = []
        if policies:
            said.append(f"{len(policies)} ValidatingAdmissionPolicy evaluated on {total} updates of pdp-injector")
        if pod_policies:
            said.append(f"{len(pod_policies)} on {pod_total} Pod creations")
        if secret_policies:
            said.append(f"{len(secret_policies)} on {secret_total} Secret creations")
        print(", ".join(said) + ", each allowed or denied as expected")
    return 1 if errors else 0


def port_guard_cases():
    """(case, namespace, Pod, allowed?) for pdp-node-port-guard."""
    def pod(name, containers, init=None, host_network=False):
        spec = {"containers": containers}
        if init:
            spec["initContainers"] = init
        if host_network:
            spec["hostNetwork"] = True
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    c = lambda ports=None: {"name": "c", "image": "x", **({"ports": ports} if ports is not None else {})}  # noqa: E731
    return [
        ("an app Pod without ports", "shop", pod("a", [c()]), True),
        ("containerPort 3593 without hostPort", "shop", pod("b", [c([{"containerPort": 3593}])]), True),
        ("hostPort 8080", "shop", pod("c", [c([{"containerPort": 8080, "hostPort": 8080}])]), True),
        ("hostPort 3593 in an app namespace", "shop", pod("d", [c([{"containerPort": 3593, "hostPort": 3593}])]), False),
        ("hostPort 3593 on a second container", "shop",
         pod("e", [c(), c([{"containerPort": 9000, "hostPort": 3593}])]), False),
        ("hostPort 3593 on an init container", "shop", pod("f", [c()], init=[c([{"containerPort": 1, "hostPort": 3593}])]), False),
        ("hostNetwork with containerPort 3593", "shop", pod("g", [c([{"containerPort": 3593}])], host_network=True), False),
        ("hostNetwork with another port", "shop", pod("h", [c([{"containerPort": 9090}])], host_network=True), True),
        ("the front in pdp-node", "pdp-node", pod("front", [c([{"containerPort": 3593, "hostPort": 3593}])]), True),
        ("hostPort 3592 (the front's HTTP port)", "shop", pod("i", [c([{"containerPort": 80, "hostPort": 3592}])]), False),
        ("hostNetwork with containerPort 3592", "shop", pod("j", [c([{"containerPort": 3592}])], host_network=True), False),
        ("hostPort 8013 (flagd-node-port-guard's)", "shop", pod("k", [c([{"containerPort": 8013, "hostPort": 8013}])]), True),
    ]


def flagd_port_guard_cases():
    """(case, namespace, Pod, allowed?) for flagd-node-port-guard: ports 8013 and 8015."""
    def pod(name, ports, host_network=False):
        spec = {"containers": [{"name": "c", "image": "x", "ports": ports}]}
        if host_network:
            spec["hostNetwork"] = True
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    return [
        ("containerPort 8013 without hostPort", "shop", pod("a", [{"containerPort": 8013}]), True),
        ("hostPort 8013 in an app namespace", "shop", pod("b", [{"containerPort": 8013, "hostPort": 8013}]), False),
        ("hostPort 8015 in an app namespace", "shop", pod("c", [{"containerPort": 1, "hostPort": 8015}]), False),
        ("hostNetwork with containerPort 8015", "shop", pod("d", [{"containerPort": 8015}], host_network=True), False),
        ("hostPort 8014", "shop", pod("e", [{"containerPort": 8014, "hostPort": 8014}]), True),
        ("hostPort 3593 (the Cerbos guard's)", "shop", pod("f", [{"containerPort": 3593, "hostPort": 3593}]), True),
        ("the front in flagd-node", "flagd-node",
         pod("front", [{"containerPort": 8013, "hostPort": 8013}, {"containerPort": 8015, "hostPort": 8015}]), True),
    ]


def by_controller(cases):
    """Pods are created by controllers: the user of every port-guard case."""
    return lambda: [(case, "system:serviceaccount:kube-system:replicaset-controller", ns, pod, want)
                    for case, ns, pod, want in cases()]


POD_POLICIES = {"pdp-node-port-guard": by_controller(port_guard_cases),
                "flagd-node-port-guard": by_controller(flagd_port_guard_cases)}


def secret_guard_cases():
    """(case, user, namespace, Secret, allowed?) for pdp-injector-secret-guard."""
    sa = "system:serviceaccount:pdp-system:pdp-injector"
    secret = lambda name=None, generate=None: {"apiVersion": "v1", "kind": "Secret",  # noqa: E731
                                               "metadata": {k: v for k, v in (("name", name), ("generateName", generate)) if v},
                                               "type": "kubernetes.io/tls"}
    return [
        ("the webhook creates its own Secret", sa, "pdp-system", secret("pdp-injector-tls"), True),
        ("the webhook creates another Secret", sa, "pdp-system", secret("registry-credentials"), False),
        ("the webhook creates a Secret by generateName", sa, "pdp-system", secret(generate="pdp-injector-tls-"), False),
        ("the webhook creates its Secret's name elsewhere", sa, "default", secret("pdp-injector-tls"), False),
        ("an admin creates another Secret", "alice", "pdp-system", secret("registry-credentials"), True),
        ("another ServiceAccount of pdp-system", "system:serviceaccount:pdp-system:other", "pdp-system",
         secret("x"), True),
    ]


SECRET_POLICIES = {"pdp-injector-secret-guard": secret_guard_cases}


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "split":
        sys.exit(split(sys.argv[2]))
    if cmd == "configs":
        sys.exit(configs(sys.argv[2]))
    if cmd == "wiring":
        sys.exit(wiring(sys.argv[2], sys.argv[3]))
    if cmd == "refs":
        sys.exit(refs(sys.argv[2]))
    if cmd == "cel":
        sys.exit(cel_guard(sys.argv[2]))
    sys.exit(f"unknown command {cmd}")
