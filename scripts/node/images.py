#!/usr/bin/env python3
"""Writes the node tier's container images as OCI image archives, without a container engine or a registry.

    images.py --out-dir DIR --pdp-injector BIN --pdp-await BIN --cerbos BIN --busybox BIN --client BIN \
              --flagd-probe BIN

Each image is one uncompressed layer (a deterministic tar of a small root filesystem: files owned by root, mtime 0,
sorted), an image config and a manifest, in an OCI layout archive whose index names the image
(`io.containerd.image.name`), which `ctr -n k8s.io images import` stores under exactly that name. An archive is
rewritten only when its inputs change (the file name carries a hash of them). Prints one line per image:
`NAME ARCHIVE`.

The images, under the names the manifests and the injector's built-in profile use (pulled with IfNotPresent):

  ghcr.io/pdp-injector/pdp-injector:0.1.0  the webhook binary (the checkout's build) at /usr/local/bin/pdp-injector,
                                           with the shared libraries it links (from this machine), user 65532, like
                                           the repository's Dockerfile (distroless cc + the binary), and the static
                                           classic-sidecar helper at /usr/local/bin/pdp-await (tools/pdp-await)
  ghcr.io/cerbos/cerbos:0.42.0             the cerbos binary of the npm package @cerbos/cerbos-linux-x64 at /cerbos
                                           (the official image's entrypoint), CERBOS_NO_TELEMETRY=1 in its env. The
                                           version inside is the npm package's (see scripts/node/README.md)
  docker.io/library/busybox:1.37.0         Debian's busybox-static with its applet links (test Pods)
  registry.k8s.io/pause:3.9                the sandbox image (containerd's sandbox_image): busybox sleeping
  localhost/pdp-injector-node/pdpclient:dev  the test client (scripts/node/pdpclient)
  localhost/pdp-injector-node/flagd-probe:dev  an app on the official OpenFeature Rust flagd provider
                                           (tools/flagd-probe), with the shared libraries it links
  localhost/pdp-injector-node/cerbos:next  the same Cerbos as another image (a marker file makes its digest
                                           differ): the "new image" of the PDP upgrade case
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

PDP_INJECTOR = "ghcr.io/pdp-injector/pdp-injector:0.1.0"
CERBOS = "ghcr.io/cerbos/cerbos:0.42.0"
BUSYBOX = "docker.io/library/busybox:1.37.0"
PAUSE = "registry.k8s.io/pause:3.9"
CLIENT = "localhost/pdp-injector-node/pdpclient:dev"
CERBOS_NEXT = "localhost/pdp-injector-node/cerbos:next"
FLAGD_PROBE = "localhost/pdp-injector-node/flagd-probe:dev"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORMAT = "1"  # bump when the layout below changes


def file_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def shared_libs(binary):
    """The shared objects `binary` loads (ldd), plus the dynamic loader; [] for a static binary."""
    p = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if p.returncode != 0 or "not a dynamic executable" in p.stdout + p.stderr or "statically linked" in p.stdout:
        return []
    libs = []
    for line in p.stdout.splitlines():
        parts = line.split()
        if "=>" in parts:
            target = parts[parts.index("=>") + 1]
            if target.startswith("/"):
                libs.append(target)
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])  # the loader, e.g. /lib64/ld-linux-x86-64.so.2
    return libs


class Layer:
    """A deterministic tar: entries added as (path in image, kind, ...)."""

    def __init__(self):
        self.entries = {}  # path -> (kind, data/source/target, mode)

    def dir(self, path, mode=0o755):
        path = path.strip("/")
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            p = "/".join(parts[:i])
            if p not in self.entries:
                self.entries[p] = ("dir", None, 0o755 if i < len(parts) else mode)

    def file(self, path, source, mode=0o755):
        path = path.strip("/")
        self.dir(os.path.dirname(path)) if "/" in path else None
        self.entries[path] = ("file", source, mode)

    def data(self, path, data, mode=0o644):
        path = path.strip("/")
        self.dir(os.path.dirname(path)) if "/" in path else None
        self.entries[path] = ("data", data, mode)

    def link(self, path, target):
        path = path.strip("/")
        self.dir(os.path.dirname(path)) if "/" in path else None
        self.entries[path] = ("symlink", target, 0o777)

    def bytes(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                kind, what, mode = self.entries[path]
                ti = tarfile.TarInfo(path)
                ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname, ti.mode = 0, 0, 0, "root", "root", mode
                if kind == "dir":
                    ti.type = tarfile.DIRTYPE
                    tar.addfile(ti)
                elif kind == "symlink":
                    ti.type, ti.linkname = tarfile.SYMTYPE, what
                    tar.addfile(ti)
                else:
                    data = Path(what).read_bytes() if kind == "file" else what.encode()
                    ti.size = len(data)
                    tar.addfile(ti, io.BytesIO(data))
        return buf.getvalue()


def oci_archive(name, layer_bytes, config, out):
    """An OCI image layout archive (oci-layout, index.json, blobs) naming the image `name`."""
    blobs = {}

    def blob(data, media_type):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer = blob(layer_bytes, "application/vnd.oci.image.layer.v1.tar")
    cfg = {"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z", "config": config,
           "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
           "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "scripts/node/images.py"}]}
    cfg_desc = blob(json.dumps(cfg, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": cfg_desc, "layers": [layer]}
    man_desc = blob(json.dumps(manifest, sort_keys=True).encode(), "application/vnd.oci.image.manifest.v1+json")
    man_desc["annotations"] = {"io.containerd.image.name": name,
                               "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}
    man_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [man_desc]}
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        def add(path, data):
            ti = tarfile.TarInfo(path)
            ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
            tar.addfile(ti, io.BytesIO(data))
        add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add("index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in sorted(blobs.items()):
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    tmp.rename(out)


def busybox_applets(busybox):
    out = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, check=True).stdout
    return [a for a in out.split() if a and not a.endswith("busybox")]


def images(args):
    """name -> (inputs for the cache key, layer builder, config)."""
    def passwd(layer, users):
        layer.data("etc/passwd", "".join(f"{n}:x:{u}:{u}::/:/sbin/nologin\n" for n, u in users))
        layer.data("etc/group", "".join(f"{n}:x:{u}:\n" for n, u in users))

    def webhook():
        layer = Layer()
        # A debug build carries ~200 MB of debug info: the image gets a copy without it (strip --strip-debug).
        binary = args.out_dir / "pdp-injector.stripped"
        shutil.copyfile(args.pdp_injector, binary)
        if shutil.which("strip"):
            subprocess.run(["strip", "--strip-debug", str(binary)], check=True)
        layer.file("usr/local/bin/pdp-injector", binary)
        layer.file("usr/local/bin/pdp-await", args.pdp_await)
        for lib in shared_libs(args.pdp_injector):
            layer.file(lib, os.path.realpath(lib))
        layer.dir("tmp", 0o1777)
        passwd(layer, [("root", 0), ("nonroot", 65532)])
        return layer, {"Entrypoint": ["/usr/local/bin/pdp-injector"], "Cmd": ["serve"], "User": "65532:65532",
                       "Env": [PATH_ENV], "ExposedPorts": {"8443/tcp": {}}}

    def cerbos(marker=None):
        layer = Layer()
        if marker:
            layer.data("etc/pdp-injector-node-image", marker + "\n")
        layer.file("cerbos", args.cerbos)
        layer.dir("tmp", 0o1777)
        passwd(layer, [("root", 0), ("cerbos", 10001)])
        # Telemetry off in every Cerbos this tier runs, whatever the Pod spec says.
        return layer, {"Entrypoint": ["/cerbos"], "Cmd": ["server"], "User": "10001:10001",
                       "Env": [PATH_ENV, "CERBOS_NO_TELEMETRY=1"], "WorkingDir": "/"}

    def busybox():
        layer = Layer()
        layer.file("bin/busybox", args.busybox)
        for applet in busybox_applets(args.busybox):
            layer.link(applet, "/bin/busybox")
        layer.dir("tmp", 0o1777)
        passwd(layer, [("root", 0), ("nobody", 65534)])
        return layer, {"Cmd": ["sh"], "Env": [PATH_ENV]}

    def pause():
        layer = Layer()
        layer.file("bin/busybox", args.busybox)
        return layer, {"Entrypoint": ["/bin/busybox", "sleep", "2147483647"], "Env": [PATH_ENV], "User": "65535"}

    def client():
        layer = Layer()
        layer.file("pdpclient", args.client)
        return layer, {"Entrypoint": ["/pdpclient"], "Cmd": ["check"], "User": "65532:65532", "Env": [PATH_ENV]}

    def flagd_probe():
        layer = Layer()
        layer.file("flagd-probe", args.flagd_probe)
        for lib in shared_libs(args.flagd_probe):
            layer.file(lib, os.path.realpath(lib))
        return layer, {"Entrypoint": ["/flagd-probe"], "User": "65532:65532", "Env": [PATH_ENV]}

    return {
        FLAGD_PROBE: ([args.flagd_probe] + shared_libs(args.flagd_probe), flagd_probe),
        PDP_INJECTOR: ([args.pdp_injector, args.pdp_await] + shared_libs(args.pdp_injector), webhook),
        CERBOS: ([args.cerbos], cerbos),
        CERBOS_NEXT: ([args.cerbos], lambda: cerbos(CERBOS_NEXT)),
        BUSYBOX: ([args.busybox], busybox),
        PAUSE: ([args.busybox], pause),
        CLIENT: ([args.client], client),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True, type=Path)
    ap.add_argument("--pdp-injector", required=True)
    ap.add_argument("--pdp-await", required=True)
    ap.add_argument("--cerbos", required=True)
    ap.add_argument("--busybox", required=True)
    ap.add_argument("--client", required=True)
    ap.add_argument("--flagd-probe", required=True)
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    me = file_hash(__file__)
    for name, (inputs, build) in images(args).items():
        key = hashlib.sha256((FORMAT + me + name + "".join(file_hash(i) for i in inputs)).encode()).hexdigest()[:16]
        slug = name.replace("/", "_").replace(":", "_")
        out = args.out_dir / f"{slug}-{key}.tar"
        if not out.exists():
            for old in args.out_dir.glob(f"{slug}-*.tar"):
                old.unlink()  # superseded
            layer, config = build()
            oci_archive(name, layer.bytes(), config, out)
            print(f"[images] wrote {out} ({out.stat().st_size // 1024} KiB)", file=sys.stderr)
        print(f"{name} {out}")


if __name__ == "__main__":
    main()
