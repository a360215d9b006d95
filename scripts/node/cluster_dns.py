#!/usr/bin/env python3
"""The node tier's cluster DNS (see scripts/node/README.md, "Cluster DNS"): answers A queries for
`<service>.<namespace>.svc.<domain>` with the Service's ClusterIP, from a list + watch of the API's Services.
Authoritative for everything it is asked and never forwards (it has no upstream): any other name is NXDOMAIN.

    cluster_dns.py --listen IP --api URL --ca FILE --cert FILE --key FILE [--domain cluster.local]

Listens on IP port 53, UDP and TCP, and on nothing else. Until the first list of Services has arrived it answers
SERVFAIL (a resolver tries again) rather than NXDOMAIN (it would give up). A name that exists without an A
record (a headless or ExternalName Service, an AAAA query) gets NOERROR with no answer, as cluster DNS does.
The wire format is dnslib's (PyPI, pinned in DNSLIB, fetched and checked by `dnslib_dir()`); cluster.py starts
this with dnslib on PYTHONPATH, as root like the tier's other components (port 53; it does not drop to another
user: Python here lives under /root, and the modules it imports lazily, such as the idna codec, would fail).
"""
import argparse
import json
import ssl
import sys
import threading
import time
import urllib.request
from pathlib import Path

DNSLIB = ("dnslib", "0.9.26", "e68719e633d761747c7e91bd241019ef5a2b61a63f56025939e144c841a70e0d")
TTL = 5  # seconds: a Service re-created with another IP is seen soon


def dnslib_dir():
    """The unpacked dnslib wheel (fetched from PyPI and checked against DNSLIB's digest once, then cached)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import helm_check  # the tier's other PyPI needs (helm, kubernetes-validate) are cached there too
    return helm_check.wheel_dir(*DNSLIB, "dnslib/server.py")


def query(server, name, qtype="A", tcp=False, port=53):
    """One query to `server` (dnslib on the path from dnslib_dir()); returns the parsed reply (dnslib's DNSRecord)."""
    lib = str(dnslib_dir())
    if lib not in sys.path:
        sys.path.insert(0, lib)
    from dnslib import DNSRecord
    return DNSRecord.parse(DNSRecord.question(name, qtype).send(server, port, tcp=tcp, timeout=2))


def log(msg):
    print(f"[dns] {msg}", flush=True)


class Services:
    """(name, namespace) -> ClusterIP ("" for a Service without one), kept current by list + watch."""

    def __init__(self, api, ctx):
        self.api, self.ctx = api.rstrip("/"), ctx
        self.lock = threading.Lock()
        self.ips = {}
        self.synced = threading.Event()

    def lookup(self, name, ns):
        with self.lock:
            return self.ips.get((name, ns))

    @staticmethod
    def ip_of(svc):
        ip = (svc.get("spec") or {}).get("clusterIP") or ""
        return "" if ip == "None" else ip

    def get(self, path, timeout):
        return urllib.request.urlopen(self.api + path, context=self.ctx, timeout=timeout)

    def relist(self):
        with self.get("/api/v1/services", 30) as r:
            body = json.load(r)
        ips = {(s["metadata"]["name"], s["metadata"]["namespace"]): self.ip_of(s) for s in body["items"]}
        with self.lock:
            self.ips = ips
        self.synced.set()
        return body["metadata"]["resourceVersion"]

    def watch(self, rv):
        # The server ends a watch after timeoutSeconds; a read timeout longer than that means the connection died.
        with self.get(f"/api/v1/services?watch=1&resourceVersion={rv}&timeoutSeconds=240", 300) as r:
            for line in r:
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":  # e.g. 410 Gone: the resourceVersion is too old; list again
                    raise RuntimeError(f"watch: {obj.get('message', obj)}")
                key = (obj["metadata"]["name"], obj["metadata"]["namespace"])
                with self.lock:
                    if ev["type"] == "DELETED":
                        self.ips.pop(key, None)
                    else:
                        self.ips[key] = self.ip_of(obj)

    def run(self):
        while True:
            try:
                rv = self.relist()
                log(f"{len(self.ips)} Services listed")
                self.watch(rv)
            except Exception as e:  # noqa: BLE001 - the API restarts, a watch expires: list again
                log(f"Services: {type(e).__name__}: {e}; listing again in 1 s")
                time.sleep(1)


def make_resolver(services, domain):
    from dnslib import QTYPE, RCODE, RR, A
    from dnslib.server import BaseResolver

    suffix = ("svc",) + tuple(domain.split("."))

    class Resolver(BaseResolver):
        def resolve(self, request, handler):
            # Authoritative, no recursion offered: nothing is ever asked of another server.
            reply = request.reply(ra=0, aa=1)
            try:
                if request.header.opcode != 0 or len(request.questions) != 1:
                    reply.header.rcode = RCODE.NOTIMP if request.header.opcode != 0 else RCODE.FORMERR
                    return reply
                if not services.synced.is_set():
                    reply.header.rcode = RCODE.SERVFAIL
                    return reply
                q = request.q
                labels = tuple(l.decode("ascii", "replace").lower() for l in q.qname.label)
                ip = None
                if len(labels) == 2 + len(suffix) and labels[2:] == suffix:
                    ip = services.lookup(labels[0], labels[1])
                if ip is None:
                    reply.header.rcode = RCODE.NXDOMAIN
                elif ip and q.qtype in (QTYPE.A, QTYPE.ANY):
                    reply.add_answer(RR(q.qname, QTYPE.A, rdata=A(ip), ttl=TTL))
                return reply
            except Exception as e:  # noqa: BLE001 - a bad query never stops the server
                log(f"error answering {request.q.qname}: {type(e).__name__}: {e}")
                reply.header.rcode = RCODE.SERVFAIL
                return reply
    return Resolver()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True, help="the one address to listen on (port 53, UDP and TCP)")
    ap.add_argument("--port", type=int, default=53)
    ap.add_argument("--api", required=True, help="the API server's URL")
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--domain", default="cluster.local")
    args = ap.parse_args()
    from dnslib.server import DNSLogger, DNSServer

    ctx = ssl.create_default_context(cafile=args.ca)
    ctx.load_cert_chain(args.cert, args.key)
    services = Services(args.api, ctx)
    resolver = make_resolver(services, args.domain)
    # One line per answer (name, type, rcode, answers) and per error; not the raw packets.
    logger = DNSLogger("-recv,-send,-request,-data", prefix=False)
    servers = [DNSServer(resolver, address=args.listen, port=args.port, tcp=tcp, logger=logger)
               for tcp in (False, True)]
    for s in servers:
        s.start_thread()
    log(f"listening on {args.listen}:{args.port} (UDP, TCP) for *.svc.{args.domain}, no upstream")
    services.run()


if __name__ == "__main__":
    main()
