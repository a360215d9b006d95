#!/usr/bin/env python3
"""A second mutating webhook for the reinvocation case.

For a Pod CREATE whose annotation `e2e.pdp-injector.io/add-container` names a container that the Pod does not have
yet, it appends that container (image from `e2e.pdp-injector.io/add-image`, default the pause image) with a JSON
patch. Anything else is allowed unchanged. Every review it answers is appended to --record as one JSON line
(uid, pod name, whether it patched, the container names it saw), so the harness can tell how often it ran.

Usage: adder_webhook.py --listen 127.0.0.1:PORT --cert tls.crt --key tls.key --record FILE
"""
import argparse
import base64
import http.server
import json
import ssl
import sys
import threading

ANNOTATION = "e2e.pdp-injector.io/add-container"
IMAGE_ANNOTATION = "e2e.pdp-injector.io/add-image"
DEFAULT_IMAGE = "registry.k8s.io/pause:3.9"

record_lock = threading.Lock()


def review_response(review, record_path):
    req = review.get("request") or {}
    uid = req.get("uid", "")
    pod = req.get("object") or {}
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    names = [c.get("name") for c in containers]
    response = {"uid": uid, "allowed": True}
    want = ann.get(ANNOTATION)
    patched = False
    if req.get("operation") == "CREATE" and req.get("kind", {}).get("kind") == "Pod" and want and want not in names:
        patch = [{
            "op": "add",
            "path": "/spec/containers/-",
            "value": {"name": want, "image": ann.get(IMAGE_ANNOTATION, DEFAULT_IMAGE)},
        }]
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        patched = True
    with record_lock, open(record_path, "a") as f:
        f.write(json.dumps({"uid": uid, "name": meta.get("name") or meta.get("generateName"),
                            "namespace": req.get("namespace"), "patched": patched, "containers": names,
                            "dryRun": req.get("dryRun", False)}) + "\n")
    return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview",
            "response": response}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--record", required=True)
    args = ap.parse_args()
    host, port = args.listen.rsplit(":", 1)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            sys.stderr.write("adder: " + (fmt % a) + "\n")

        def _send(self, code, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                review = json.loads(self.rfile.read(length))
            except ValueError as e:
                self._send(400, json.dumps({"error": str(e)}))
                return
            self._send(200, json.dumps(review_response(review, args.record)))

    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    sys.stderr.write(f"adder: listening on https://{args.listen}\n")
    sys.stderr.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    main()
