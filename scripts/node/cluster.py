#!/usr/bin/env python3
"""A one-node Kubernetes 1.20 cluster on this machine, without a container engine (see scripts/node/README.md).

    cluster.py up --bin-dir-map ... | down | status      (normally through scripts/node/cluster.sh)

up: etcd, kube-apiserver, kube-controller-manager, kube-scheduler on the node address; containerd + runc (CRI,
overlayfs, cgroupfs); CNI bridge + host-local + portmap; kubelet; kube-proxy (iptables). The node address is a /32
on `lo` (NODE_IP), so every listener and every packet stays on this machine: loopback, and Pod addresses inside
the network namespaces that this cluster's containerd creates. Idempotent: a running component is left alone,
a stopped one is started again.

down: stops every process that up started (by the PIDs it recorded, SIGTERM then SIGKILL), and the containers'
shims that this cluster's containerd started, and removes exactly what up added, as recorded in
$STATE/added.json when it added it: the address, the bridge and its route, iptables chains and rules, network
namespaces, mounts, cgroups, sysctl values (restored), directories, the state and run directories.
"""
import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import tier  # noqa: E402  (what the tiers share: scripts/lib/tier.py)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster_dns  # noqa: E402  (the tier's cluster DNS, started by up)

STATE = Path(os.environ.get("NODE_STATE_DIR", "/var/lib/pdp-injector-node"))
RUN = Path(os.environ.get("NODE_RUN_DIR", "/run/pdp-injector-node"))
NODE_IP = os.environ.get("NODE_IP", "10.245.0.1")
NODE_NAME = os.environ.get("NODE_NAME", "pdp-node")
POD_CIDR = os.environ.get("NODE_POD_CIDR", "10.244.0.0/24")
POD_GW = POD_CIDR.rsplit(".", 1)[0] + ".1"
SVC_CIDR = os.environ.get("NODE_SVC_CIDR", "10.96.0.0/24")
SVC_KUBERNETES = SVC_CIDR.rsplit(".", 1)[0] + ".1"
BRIDGE = os.environ.get("NODE_BRIDGE", "pdpnode0")
API_PORT = 6443
CNI_BIN = "/usr/lib/cni"
SANDBOX_IMAGE = "registry.k8s.io/pause:3.9"
ADDED = STATE / "added.json"
LOGS = STATE / "logs"
PIDS = RUN / "pids"
PKI = STATE / "pki"
CTR_SOCK = RUN / "containerd" / "containerd.sock"
ADMIN_KUBECONFIG = STATE / "admin.kubeconfig"
# The sysctls that the kubelet, kube-proxy and the CNI bridge plugin set: saved by up, restored by down.
SYSCTLS = ["net.ipv4.ip_forward", "net.ipv4.conf.all.route_localnet", "net.bridge.bridge-nf-call-iptables",
           "net.bridge.bridge-nf-call-ip6tables", "vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic",
           "kernel.panic_on_oops", "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes"]
# Directories outside STATE/RUN that the components create; removed by down if up found them absent.
OUTSIDE_DIRS = ["/var/log/pods", "/var/log/containers", "/var/run/cerbos", "/var/run/cerbos-instances",
                "/run/containerd", "/var/lib/cni", "/run/netns", "/var/run/netns", "/etc/cni", "/opt/cni"]
COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "dns", "containerd", "kubelet",
              "kube-proxy"]
CLUSTER_DOMAIN = "cluster.local"
DNS_USER = "system:pdp-node-dns"


log = tier.logger("cluster")


def sh(*argv, check=True, input=None, timeout=120, quiet=False):
    return tier.run(*argv, check_rc=check, input=input, timeout=timeout)


def wait_for(what, fn, timeout, interval=0.5, proc=None):
    def gone():
        return f"{proc} exited:\n{tail(proc)}" if proc and not alive(proc) else None
    tier.wait_for(what, fn, timeout, interval=interval, still_alive=gone)


def tail(name, n=40):
    p = LOGS / f"{name}.log"
    return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else "(no log)"


# ---- the record of what up added ---------------------------------------------------------------------------

def added():
    return json.loads(ADDED.read_text()) if ADDED.exists() else {}


def record(key, value):
    a = added()
    if key not in a:
        a[key] = value
        ADDED.write_text(json.dumps(a, indent=1))


# ---- processes ---------------------------------------------------------------------------------------------

def pid_of(name):
    f = PIDS / f"{name}.pid"
    if not f.exists():
        return None
    pid, start = f.read_text().split()
    return int(pid), start


def proc_start(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(name):
    """The process we recorded is still the one running under that PID (PID and start time match)."""
    rec = pid_of(name)
    if not rec:
        return False
    pid, start = rec
    st = proc_start(pid)
    if st != start:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start(name, argv, env=None):
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    fh = open(LOGS / f"{name}.log", "ab")
    p = subprocess.Popen([str(a) for a in argv], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         env={**os.environ, **(env or {})}, start_new_session=True, close_fds=True)
    fh.close()
    st = None
    for _ in range(50):
        st = proc_start(p.pid)
        if st:
            break
        time.sleep(0.01)
    (PIDS / f"{name}.pid").write_text(f"{p.pid} {st}\n")
    log(f"started {name} (pid {p.pid}), log {LOGS / (name + '.log')}")
    return p


def stop(name, timeout=20):
    rec = pid_of(name)
    if not rec:
        return
    pid, _ = rec
    if alive(name):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(name) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(name):
            log(f"{name} (pid {pid}) ignored SIGTERM for {timeout}s: SIGKILL")
            os.kill(pid, signal.SIGKILL)
            while alive(name):
                time.sleep(0.1)
        log(f"stopped {name} (pid {pid})")
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    (PIDS / f"{name}.pid").unlink(missing_ok=True)


def shim_pids():
    """containerd-shim processes of THIS cluster's containerd (their command line names our containerd socket)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].decode(errors="replace").endswith(("containerd-shim-runc-v2", "containerd-shim")) \
                and str(CTR_SOCK).encode() in b" ".join(cmd):
            out.append(int(d.name))
    return out


# ---- certificates and kubeconfigs --------------------------------------------------------------------------

def openssl_cert(name, subj, **kind):
    tier.Pki(PKI).cert(name, subj, **kind)


def kubeconfig(name, user):
    path = STATE / f"{name}.kubeconfig"
    path.write_text(tier.kubeconfig(f"https://{NODE_IP}:{API_PORT}", PKI / "ca.crt", user,
                                    cert=PKI / f"{name}.crt", key=PKI / f"{name}.key", context="pdp-node"))
    return path


def make_pki():
    PKI.mkdir(parents=True, exist_ok=True)
    openssl_cert("ca", "/CN=pdp-injector-node-ca", ca=True)
    openssl_cert("apiserver", "/CN=kube-apiserver", server=True,
                 san=f"IP:{NODE_IP},IP:{SVC_KUBERNETES},IP:127.0.0.1,DNS:localhost,DNS:kubernetes,"
                     "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
    openssl_cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", client=True)
    openssl_cert("admin", "/O=system:masters/CN=pdp-node-admin", client=True)
    openssl_cert("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", client=True)
    openssl_cert("kubelet-serving", f"/CN={NODE_NAME}", server=True, san=f"IP:{NODE_IP},DNS:{NODE_NAME}")
    openssl_cert("kube-controller-manager", "/CN=system:kube-controller-manager", client=True)
    openssl_cert("kube-scheduler", "/CN=system:kube-scheduler", client=True)
    openssl_cert("kube-proxy", "/CN=system:kube-proxy", client=True)
    openssl_cert("dns", f"/CN={DNS_USER}", client=True)
    tier.Pki(PKI).service_account_keys()
    for n in ["admin", "kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy"]:
        kubeconfig(n, n)


# ---- host networking ---------------------------------------------------------------------------------------

def sysctl_path(name):
    return Path("/proc/sys") / name.replace(".", "/")


def iptables_chains(cmd, table):
    p = sh(cmd, "-t", table, "-S", check=False)
    if p.returncode != 0:
        return None
    return sorted({line.split()[1] for line in p.stdout.splitlines() if line.startswith("-N ")})


def snapshot_host():
    """What exists before this cluster touches the host: recorded once, by the first up."""
    if "before" in added():
        return
    before = {"sysctl": {}, "iptables": {}, "dirs": {}, "netns": [], "cgroups": [], "mounts": []}
    for s in SYSCTLS:
        p = sysctl_path(s)
        before["sysctl"][s] = p.read_text().strip() if p.exists() else None
    for cmd in ["iptables", "ip6tables"]:
        for table in ["filter", "nat", "mangle"]:
            before["iptables"][f"{cmd}/{table}"] = iptables_chains(cmd, table)
    for d in OUTSIDE_DIRS:
        before["dirs"][d] = os.path.lexists(d)
    for d in ["/run/netns", "/var/run/netns"]:
        if os.path.isdir(d):
            before["netns"] += [f"{d}/{n}" for n in os.listdir(d)]
    before["cgroups"] = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods*"))
    record("before", before)


def setup_network():
    # The node address: a /32 on lo. Everything listens here; Pods reach it through the bridge's gateway.
    if f"inet {NODE_IP}/32" not in sh("ip", "-o", "addr", "show", "dev", "lo").stdout:
        record("lo_address", f"{NODE_IP}/32")
        sh("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
    # The Pod bridge (the CNI bridge plugin reuses it) and a route that keeps the Service range on it: a packet to a
    # ClusterIP that kube-proxy does not translate ends on this bridge, never on the machine's default route.
    if sh("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        record("bridge", BRIDGE)
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    if f"inet {POD_GW}/" not in sh("ip", "-o", "addr", "show", "dev", BRIDGE).stdout:
        sh("ip", "addr", "add", f"{POD_GW}/{POD_CIDR.split('/')[1]}", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    if SVC_CIDR not in sh("ip", "route", "show", SVC_CIDR).stdout:
        record("svc_route", SVC_CIDR)
        sh("ip", "route", "add", SVC_CIDR, "dev", BRIDGE)
    # Guard: nothing is forwarded between the Pod bridge and any other interface (Pods reach only this machine's
    # addresses and each other). Inserted first in FORWARD; removed by down.
    if "PDPNODE-GUARD" not in (iptables_chains("iptables", "filter") or []):
        record("guard", True)
        sh("iptables", "-N", "PDPNODE-GUARD")
        sh("iptables", "-A", "PDPNODE-GUARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
        sh("iptables", "-A", "PDPNODE-GUARD", "-o", BRIDGE, "!", "-i", BRIDGE, "-j", "DROP")
    if sh("iptables", "-C", "FORWARD", "-j", "PDPNODE-GUARD", check=False).returncode != 0:
        sh("iptables", "-I", "FORWARD", "1", "-j", "PDPNODE-GUARD")
    # The bridge plugin turns forwarding on (isGateway); br_netfilter lets conntrack see hairpin hostPort replies.
    for name, value in [("net.ipv4.ip_forward", "1"), ("net.bridge.bridge-nf-call-iptables", "1")]:
        p = sysctl_path(name)
        if p.exists() and p.read_text().strip() != value:
            p.write_text(value)


def write_configs(bins):
    (STATE / "cni/net.d").mkdir(parents=True, exist_ok=True)
    (STATE / "cni/net.d/10-pdpnode.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "pdpnode",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(STATE / "cni/ipam"),
                      "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GW}]], "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ]}, indent=1))
    (STATE / "containerd").mkdir(parents=True, exist_ok=True)
    (RUN / "containerd").mkdir(parents=True, exist_ok=True)
    (STATE / "containerd/config.toml").write_text(f"""version = 2
root = "{STATE}/containerd/root"
state = "{RUN}/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{CTR_SOCK}"
[ttrpc]
  address = "{CTR_SOCK}.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  # Without it every sandbox fails here (runc: "can't get final child's PID from pipe: EOF"): the process may
  # not lower oom_score_adj.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{RUN}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{STATE}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{STATE}/containerd/certs.d"
""")
    # No image is ever pulled: every image is imported. Should a Pod name one that is not, the pull goes to a closed
    # port on loopback (every registry, and the default for any other), never to a registry or a DNS server.
    for host in ["_default", "docker.io", "ghcr.io", "registry.k8s.io", "k8s.gcr.io", "quay.io", "localhost"]:
        d = STATE / "containerd/certs.d" / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text('server = "http://127.0.0.1:9"\n\n[host."http://127.0.0.1:9"]\n'
                                      '  capabilities = ["pull", "resolve"]\n')
    # The node's resolv.conf, which Pods with dnsPolicy Default (and host-network Pods) get: nothing may leave the
    # machine, so a lookup there fails at once. Every other Pod gets the cluster DNS (clusterDNS below).
    (STATE / "resolv.conf").write_text("nameserver 127.0.0.1\noptions ndots:1 timeout:1 attempts:1\n")
    (STATE / "kubelet").mkdir(parents=True, exist_ok=True)
    (STATE / "kubelet-config.json").write_text(json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "tlsCertFile": str(PKI / "kubelet-serving.crt"), "tlsPrivateKeyFile": str(PKI / "kubelet-serving.key"),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(PKI / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs", "failSwapOn": False, "resolvConf": str(STATE / "resolv.conf"),
        # The tier's cluster DNS (cluster_dns.py) on the node address: Pods' resolv.conf names it, with the usual
        # search list (<namespace>.svc.cluster.local svc.cluster.local cluster.local) and ndots:5.
        "clusterDNS": [NODE_IP], "clusterDomain": CLUSTER_DOMAIN,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        # No registry to pull from again: never garbage-collect the imported images.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "maxPods": 60, "protectKernelDefaults": False,
        "syncFrequency": "10s", "fileCheckFrequency": "10s",
    }, indent=1))


# ---- cluster DNS -------------------------------------------------------------------------------------------

def start_dns():
    """cluster_dns.py on NODE_IP:53 (UDP, TCP), reading Services as DNS_USER, bound to the built-in ClusterRole
    system:kube-dns (list and watch Services and Endpoints, nothing else)."""
    lib = str(cluster_dns.dnslib_dir())
    kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "pdp-node-dns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kube-dns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": DNS_USER}]}))
    if not alive("dns"):
        start("dns", [sys.executable, Path(cluster_dns.__file__).resolve(), "--listen", NODE_IP,
                      "--api", f"https://{NODE_IP}:{API_PORT}", "--ca", PKI / "ca.crt", "--cert", PKI / "dns.crt",
                      "--key", PKI / "dns.key", "--domain", CLUSTER_DOMAIN], env={"PYTHONPATH": lib})
    name = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
    wait_for(f"the cluster DNS to answer {name} with {SVC_KUBERNETES}",
             lambda: [str(a.rdata) for a in cluster_dns.query(NODE_IP, name).rr] == [SVC_KUBERNETES], 60, proc="dns")


# ---- up ----------------------------------------------------------------------------------------------------

def kubectl(*args, check=True, input=None, timeout=60):
    return sh("kubectl", f"--kubeconfig={ADMIN_KUBECONFIG}", "--request-timeout=20s", *args, check=check,
              input=input, timeout=timeout)


def api_ready():
    return kubectl("get", "--raw", "/readyz", check=False, timeout=25).returncode == 0


def up(args):
    t0 = time.monotonic()
    STATE.mkdir(parents=True, exist_ok=True)
    RUN.mkdir(parents=True, exist_ok=True)
    snapshot_host()
    make_pki()
    setup_network()
    write_configs(args)
    bins = {"etcd": args.etcd, "kube-apiserver": args.kube_apiserver, "kubelet": args.kubelet,
            "kube-controller-manager": args.kube_controller_manager, "kube-scheduler": args.kube_scheduler,
            "kube-proxy": args.kube_proxy}

    if not alive("etcd"):
        start("etcd", tier.etcd_argv(bins["etcd"], "pdp-node", STATE / "etcd", 2379, 2380, host=NODE_IP))
    wait_for("etcd", lambda: tier.etcd_healthy(NODE_IP, 2379), 60, proc="etcd")

    if not alive("kube-apiserver"):
        start("kube-apiserver", [
            bins["kube-apiserver"], "--etcd-servers", f"http://{NODE_IP}:2379",
            "--bind-address", NODE_IP, "--advertise-address", NODE_IP, "--secure-port", API_PORT,
            "--cert-dir", STATE / "apiserver-certs",
            "--tls-cert-file", PKI / "apiserver.crt", "--tls-private-key-file", PKI / "apiserver.key",
            "--client-ca-file", PKI / "ca.crt",
            "--kubelet-client-certificate", PKI / "apiserver-kubelet-client.crt",
            "--kubelet-client-key", PKI / "apiserver-kubelet-client.key",
            "--kubelet-preferred-address-types", "InternalIP",
            "--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
            "--service-account-key-file", PKI / "sa.pub", "--service-account-signing-key-file", PKI / "sa.key",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", SVC_CIDR, "--allow-privileged=true",
            "--profiling=false", "--logtostderr", "-v", "1"])
    wait_for("kube-apiserver /readyz", api_ready, 120, interval=1, proc="kube-apiserver")
    t_api = time.monotonic()

    start_dns()

    if not alive("kube-controller-manager"):
        start("kube-controller-manager", [
            bins["kube-controller-manager"], "--kubeconfig", STATE / "kube-controller-manager.kubeconfig",
            "--bind-address", NODE_IP, "--secure-port", "10257", "--port", "0",
            "--service-account-private-key-file", PKI / "sa.key", "--root-ca-file", PKI / "ca.crt",
            "--use-service-account-credentials=true", "--leader-elect=false",
            "--cluster-signing-cert-file", PKI / "ca.crt", "--cluster-signing-key-file", PKI / "ca.key",
            "--profiling=false", "--logtostderr", "-v", "1"])
    if not alive("kube-scheduler"):
        start("kube-scheduler", [
            bins["kube-scheduler"], "--kubeconfig", STATE / "kube-scheduler.kubeconfig",
            "--bind-address", NODE_IP, "--secure-port", "10259", "--port", "0", "--leader-elect=false",
            "--profiling=false", "--logtostderr", "-v", "1"])

    if not alive("containerd"):
        start("containerd", ["containerd", "--config", STATE / "containerd/config.toml"])
    wait_for("containerd", lambda: sh("ctr", "--address", CTR_SOCK, "version", check=False).returncode == 0, 60,
             proc="containerd")
    for name, archive in args.image:
        sh("ctr", "--address", CTR_SOCK, "-n", "k8s.io", "images", "import", "--no-unpack=false", archive,
           timeout=300)
        log(f"image {name} imported")

    # The CSI node plugin's Bidirectional mount of the kubelet's Pod directory (templates/cerbos-node/csi-node.yaml,
    # csi-node.yaml) needs that directory on a shared mount: containerd 1.6 refuses the container otherwise
    # ("path ... is mounted on ... but it is not a shared mount"), and / is private here. So the kubelet's root
    # is a bind mount of itself, made rshared; down unmounts it with every mount under STATE.
    kubelet_root = STATE / "kubelet"
    if str(kubelet_root) not in mounts_under(kubelet_root):
        sh("mount", "--bind", kubelet_root, kubelet_root)
    sh("mount", "--make-rshared", kubelet_root)
    if not alive("kubelet"):
        start("kubelet", [
            bins["kubelet"], "--config", STATE / "kubelet-config.json",
            "--kubeconfig", STATE / "kubelet.kubeconfig", "--root-dir", STATE / "kubelet",
            "--cert-dir", STATE / "kubelet/pki", "--hostname-override", NODE_NAME, "--node-ip", NODE_IP,
            "--container-runtime", "remote", "--container-runtime-endpoint", f"unix://{CTR_SOCK}",
            "--image-service-endpoint", f"unix://{CTR_SOCK}", "--pod-infra-container-image", SANDBOX_IMAGE,
            "--logtostderr", "-v", "1"])
    if not alive("kube-proxy"):
        start("kube-proxy", [
            bins["kube-proxy"], "--kubeconfig", STATE / "kube-proxy.kubeconfig", "--proxy-mode", "iptables",
            "--hostname-override", NODE_NAME, "--cluster-cidr", POD_CIDR, "--bind-address", NODE_IP,
            "--healthz-bind-address", f"{NODE_IP}:10256", "--metrics-bind-address", f"{NODE_IP}:10249",
            "--nodeport-addresses", f"{NODE_IP}/32", "--conntrack-max-per-core", "0",
            "--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0",
            "--profiling=false", "--logtostderr", "-v", "1"])

    # 1.21+ sets kubernetes.io/metadata.name on every namespace; the webhook configuration's exclusions use it.
    for ns in ["kube-system", "kube-public", "kube-node-lease", "default"]:
        wait_for(f"namespace {ns}", lambda ns=ns: kubectl("get", "namespace", ns, check=False).returncode == 0, 60)
        kubectl("label", "namespace", ns, f"kubernetes.io/metadata.name={ns}", "--overwrite")

    def node_ready():
        p = kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if p.returncode != 0:
            return False
        conds = {c["type"]: c["status"] for c in json.loads(p.stdout)["status"].get("conditions", [])}
        return conds.get("Ready") == "True"
    wait_for(f"node {NODE_NAME} Ready", node_ready, 180, interval=1, proc="kubelet")
    t_node = time.monotonic()

    def proxy_synced():
        return "KUBE-SERVICES" in (iptables_chains("iptables", "nat") or []) and \
            SVC_KUBERNETES in sh("iptables", "-t", "nat", "-S", "KUBE-SERVICES", check=False).stdout
    wait_for("kube-proxy rules for the kubernetes Service", proxy_synced, 90, proc="kube-proxy")

    def default_sa():
        return kubectl("-n", "default", "get", "secret", "-o", "name", check=False).stdout.count("default-token") > 0
    wait_for("service account token controller", default_sa, 90, proc="kube-controller-manager")
    for c in COMPONENTS:
        if not alive(c):
            raise RuntimeError(f"{c} is not running:\n{tail(c)}")
    log(f"up in {time.monotonic() - t0:.0f}s (API ready after {t_api - t0:.0f}s, node Ready after "
        f"{t_node - t0:.0f}s); KUBECONFIG={ADMIN_KUBECONFIG}")
    print(ADMIN_KUBECONFIG)


# ---- down --------------------------------------------------------------------------------------------------

def mounts_under(*roots):
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if any(mp == str(r) or mp.startswith(str(r) + "/") for r in roots):
            out.append(mp)
    return out


def drain_pods():
    """Pods away through the kubelet, so that containerd tears down each sandbox's network (CNI DEL) itself."""
    if not (alive("kube-apiserver") and alive("kubelet") and ADMIN_KUBECONFIG.exists()):
        return
    stop("kube-controller-manager")  # nothing re-creates what is deleted now
    left = lambda: kubectl("get", "pods", "-A", "-o", "name", check=False).stdout.strip()  # noqa: E731
    # The apps first, while the node's components still serve them: a Pod whose CSI volume outlives the node
    # plugin cannot be unmounted by the kubelet.
    node_components = {"pdp-node", "pdp-flags"}
    listed = kubectl("get", "pods", "-A", "-o", "jsonpath={range .items[*]}{.metadata.namespace}{'\\n'}{end}",
                     check=False).stdout.split()
    for ns in sorted(set(listed) - node_components):
        kubectl("-n", ns, "delete", "pods", "--all", "--grace-period=2", "--wait=false", check=False)
    try:
        wait_for("the apps' Pods gone", lambda: all(
            line.split("/")[0] in node_components for line in
            kubectl("get", "pods", "-A", "-o", "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}"
                    "{'\\n'}{end}", check=False).stdout.split()), 30, interval=1)
    except RuntimeError as e:
        log(str(e))
    p = kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=2", "--wait=false", check=False)
    if p.returncode != 0:
        log(f"deleting the Pods failed: {p.stderr.strip()[-300:]}")
        return
    try:
        wait_for("every Pod gone", lambda: left() == "", 30, interval=1)
        return
    except RuntimeError as e:
        log(str(e))
    # What holds them (a volume whose driver went first, a container that ignores SIGTERM), then force them away:
    # the kubelet still stops their sandboxes.
    log("Pods left:\n" + kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout.rstrip())
    kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force", "--wait=false",
            check=False)
    try:
        wait_for("every Pod gone after a forced deletion", lambda: left() == "", 30, interval=1)
    except RuntimeError as e:
        log(str(e))


def down(_args):
    if not STATE.exists() and not RUN.exists():
        log("nothing to remove")
        return
    a = added()
    before = a.get("before", {})
    drain_pods()
    for c in ["kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager"]:
        stop(c)
    # Whatever containers are left: kill their tasks through containerd, then containerd, then leftover shims.
    if alive("containerd"):
        ctr = ["ctr", "--address", CTR_SOCK, "-n", "k8s.io"]
        tasks = sh(*ctr, "tasks", "ls", "-q", check=False).stdout.split()
        for t in tasks:
            sh(*ctr, "tasks", "kill", "-s", "SIGKILL", t, check=False)
        for t in tasks:
            for _ in range(50):
                if sh(*ctr, "tasks", "delete", t, check=False).returncode == 0:
                    break
                time.sleep(0.1)
    stop("containerd")
    for pid in shim_pids():
        log(f"SIGKILL leftover shim pid {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for c in ["dns", "kube-apiserver", "etcd"]:
        stop(c)
    for name in list(PIDS.glob("*.pid")) if PIDS.exists() else []:
        stop(name.stem)

    # kube-proxy's own cleanup of its iptables rules, then every chain that was not there before up.
    if a.get("kube_proxy_bin") and Path(a["kube_proxy_bin"]).exists():
        sh(a["kube_proxy_bin"], "--cleanup", "--proxy-mode", "iptables", check=False, timeout=60)
    for cmd in ["iptables", "ip6tables"]:
        for table in ["filter", "nat", "mangle"]:
            now = iptables_chains(cmd, table)
            if now is None:
                continue
            was = set(before.get("iptables", {}).get(f"{cmd}/{table}") or [])
            ours = [c for c in now if c not in was]
            if not ours:
                continue
            rules = sh(cmd, "-t", table, "-S").stdout.splitlines()
            for r in rules:  # jumps from chains that stay (built-in or pre-existing) into ours
                parts = shlex.split(r)  # comments are quoted
                if parts[0] == "-A" and parts[1] not in ours and "-j" in parts and parts[parts.index("-j") + 1] in ours:
                    sh(cmd, "-t", table, "-D", *parts[1:], check=False)
            for c in ours:
                sh(cmd, "-t", table, "-F", c, check=False)
            for c in ours:
                p = sh(cmd, "-t", table, "-X", c, check=False)
                if p.returncode != 0:
                    log(f"{cmd} -t {table} -X {c}: {p.stderr.strip()}")
            log(f"{cmd} -t {table}: removed chains {', '.join(ours)}")

    # Network namespaces that appeared (containerd's CNI namespaces), then mounts under our directories.
    for d in ["/run/netns", "/var/run/netns"]:
        if os.path.isdir(d):
            for n in os.listdir(d):
                p = f"{d}/{n}"
                if p not in before.get("netns", []) and os.path.realpath(p) not in \
                        [os.path.realpath(x) for x in before.get("netns", [])]:
                    sh("umount", p, check=False)
                    Path(p).unlink(missing_ok=True)
                    log(f"removed network namespace {p}")
    for mp in reversed(mounts_under(STATE, RUN)):
        if sh("umount", mp, check=False).returncode != 0:
            sh("umount", "-l", mp, check=False)
    left = mounts_under(STATE, RUN)
    if left:
        log(f"mounts still present: {left}")

    if a.get("svc_route"):
        sh("ip", "route", "del", a["svc_route"], check=False)
    if a.get("bridge"):
        sh("ip", "link", "del", a["bridge"], check=False)
    # veth pairs whose peer was in a removed namespace are gone with it; any left on our bridge go too
    if a.get("lo_address"):
        sh("ip", "addr", "del", a["lo_address"], "dev", "lo", check=False)
    for s, v in (before.get("sysctl") or {}).items():
        p = sysctl_path(s)
        if v is not None and p.exists() and p.read_text().strip() != v:
            try:
                p.write_text(v)
                log(f"sysctl {s} restored to {v}")
            except OSError as e:
                log(f"sysctl {s}: {e}")
    # cgroups the kubelet created (kubepods...): depth first.
    for top in Path("/sys/fs/cgroup").glob("*/kubepods*"):
        if str(top) in before.get("cgroups", []):
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            try:
                d.rmdir()
            except OSError:
                pass
        if top.exists():
            log(f"cgroup {top} could not be removed")
    for d, existed in (before.get("dirs") or {}).items():
        if not existed and os.path.lexists(d):
            if d in ("/run/netns", "/var/run/netns") and os.path.islink(d):
                continue
            shutil.rmtree(d, ignore_errors=True) if not os.path.islink(d) else os.unlink(d)
            log(f"removed {d}")
    shutil.rmtree(RUN, ignore_errors=True)
    shutil.rmtree(STATE, ignore_errors=True)
    log("down: done")


def leftovers():
    """What down should have removed, if anything is still there (printed by `status` and checked by run.sh)."""
    out = []
    if STATE.exists() or RUN.exists():
        out.append(f"directories {STATE} / {RUN}")
    if f"inet {NODE_IP}/32" in sh("ip", "-o", "addr", "show", "dev", "lo").stdout:
        out.append(f"address {NODE_IP}/32 on lo")
    if sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        out.append(f"bridge {BRIDGE}")
    for cmd in ["iptables", "ip6tables"]:
        for table in ["filter", "nat", "mangle"]:
            chains = [c for c in iptables_chains(cmd, table) or [] if c.startswith(("KUBE-", "CNI-", "PDPNODE-"))]
            if chains:
                out.append(f"{cmd} -t {table} chains {chains}")
    if mounts_under(STATE, RUN):
        out.append(f"mounts {mounts_under(STATE, RUN)}")
    if shim_pids():
        out.append(f"shim processes {shim_pids()}")
    for d in ["/run/netns", "/var/run/netns"]:
        if os.path.isdir(d) and [n for n in os.listdir(d) if n.startswith("cni-")]:
            out.append(f"network namespaces in {d}")
    if list(Path("/sys/fs/cgroup").glob("*/kubepods*")):
        out.append("kubepods cgroups")
    return out


def status(_args):
    rc = 0
    for c in COMPONENTS:
        rec = pid_of(c)
        state = "running" if alive(c) else ("stopped" if rec else "not started")
        print(f"{c:25} {state}" + (f" (pid {rec[0]})" if rec else ""))
        rc |= 0 if alive(c) else 1
    if ADMIN_KUBECONFIG.exists() and alive("kube-apiserver"):
        print(kubectl("get", "nodes", "-o", "wide", check=False).stdout)
        print(kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout)
        print(f"KUBECONFIG={ADMIN_KUBECONFIG}")
    left = leftovers() if not STATE.exists() else []
    for x in left:
        print(f"left behind: {x}")
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    for b in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"]:
        u.add_argument(f"--{b}", required=True)
    u.add_argument("--image", nargs=2, action="append", default=[], metavar=("NAME", "ARCHIVE"))
    sub.add_parser("down")
    sub.add_parser("status")
    sub.add_parser("leftovers")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cluster.py: needs root (network, mounts, cgroups)")
    if args.cmd == "up":
        STATE.mkdir(parents=True, exist_ok=True)
        record("kube_proxy_bin", args.kube_proxy)
        try:
            up(args)
        except Exception as e:  # noqa: BLE001
            log(f"up failed: {e}")
            for c in COMPONENTS:
                if pid_of(c) and not alive(c):
                    log(f"--- {c} exited; last lines of its log:\n{tail(c)}")
            sys.exit(1)
    elif args.cmd == "down":
        down(args)
        left = leftovers()
        for x in left:
            log(f"left behind: {x}")
        sys.exit(1 if left else 0)
    elif args.cmd == "leftovers":
        left = leftovers()
        for x in left:
            print(x)
        sys.exit(1 if left else 0)
    else:
        sys.exit(status(args))


if __name__ == "__main__":
    main()
