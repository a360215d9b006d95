"""Builds the flagd provider of openfeature-provider-flagd (PyPI) as an app does, from its environment only,
and prints as JSON what it resolved to: the resolver, and the gRPC channel it opens (target, TLS, the CA it
read, the authority override it passes). The channel functions are wrapped only to record their arguments;
the provider's own code builds everything, and nothing connects (gRPC channels connect on first use)."""

import json
import sys

import grpc

opened = []
real_insecure, real_secure, real_ssl = grpc.insecure_channel, grpc.secure_channel, grpc.ssl_channel_credentials
roots = {}


def ssl_channel_credentials(root_certificates=None, *args, **kwargs):
    creds = real_ssl(root_certificates, *args, **kwargs)
    roots[id(creds)] = root_certificates
    return creds


def insecure_channel(target, options=None, *args, **kwargs):
    opened.append({"target": target, "tls": False, "options": dict(options or []), "ca": None})
    return real_insecure(target, options, *args, **kwargs)


def secure_channel(target, credentials, options=None, *args, **kwargs):
    opened.append({"target": target, "tls": True, "options": dict(options or []), "ca": roots.get(id(credentials))})
    return real_secure(target, credentials, options, *args, **kwargs)


grpc.insecure_channel, grpc.secure_channel, grpc.ssl_channel_credentials = insecure_channel, secure_channel, ssl_channel_credentials

from openfeature.contrib.provider.flagd import FlagdProvider  # noqa: E402  (after the wrappers)

provider = FlagdProvider()
config = provider.config
if len(opened) != 1:
    print(json.dumps({"error": f"the provider opened {len(opened)} gRPC channels, expected 1"}))
    sys.exit(0)
channel = opened[0]
ca_file = None
if channel["ca"] is not None:
    # Which file the CA came from: the provider read config.cert_path; say so only if the bytes match.
    with open(config.cert_path, "rb") as f:
        ca_file = config.cert_path if f.read() == channel["ca"] else "(other bytes)"
target = channel["target"]
host, _, port = target.rpartition(":")
options = channel["options"]
print(json.dumps({
    "resolver": config.resolver.value,
    "host": host,
    "port": int(port),
    "socket": None,
    "tls": channel["tls"],
    "ca": ca_file,
    "authority": options.get("grpc.ssl_target_name_override") or options.get("grpc.default_authority"),
    "target": target,
    "selector": config.selector or "",
}))
