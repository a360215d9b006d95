"""An app on the official OpenFeature Python flagd provider (openfeature-provider-flagd), in-process, configured
only from its environment: `eval_probe.py FLAG:KIND[:KEY=VALUE,...]...` evaluates each flag every PROBE_EVERY_MS
(100) and prints a JSON line at start-up and whenever a value or an error changes; PROBE_FOR_S ends it (else
SIGTERM does), with a summary line. The same protocol as tools/flagd-probe (Rust) and eval_probe.js (Node)."""

import json
import os
import signal
import sys
import time

from openfeature import api
from openfeature.evaluation_context import EvaluationContext
from openfeature.contrib.provider.flagd import FlagdProvider


def parse(arg):
    parts = arg.split(":", 2)
    if len(parts) < 2 or not parts[0] or parts[1] not in ("bool", "string"):
        sys.exit(f"eval_probe: {arg!r} is not FLAG:bool|string[:KEY=VALUE,...]")
    fields = dict(p.split("=", 1) for p in (parts[2].split(",") if len(parts) > 2 else []) if p)
    return arg, parts[0], parts[1], EvaluationContext("probe", fields)


def say(**line):
    print(json.dumps(line), flush=True)


def main():
    probes = [parse(a) for a in sys.argv[1:]]
    if not probes:
        sys.exit("usage: eval_probe.py FLAG:KIND[:KEY=VALUE,...]...")
    every = int(os.environ.get("PROBE_EVERY_MS", "100")) / 1000
    until = time.time() + float(os.environ["PROBE_FOR_S"]) if "PROBE_FOR_S" in os.environ else None
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        api.set_provider_and_wait(FlagdProvider())
    except Exception as e:  # the provider's own error, said as the other probes say it
        say(event="error", t=time.time(), message=f"{type(e).__name__}: {e}")
        sys.exit(3)
    client = api.get_client()
    say(event="ready", t=time.time())
    rounds = failed_rounds = 0
    last = None
    while True:
        values, failed = {}, []
        for label, flag, kind, ctx in probes:
            get = client.get_boolean_details if kind == "bool" else client.get_string_details
            d = get(flag, False if kind == "bool" else "", ctx)
            if d.error_code is not None:
                values[label] = None
                failed.append({"label": label, "error": f"{d.error_code}: {d.error_message}"})
            else:
                values[label] = d.value
        rounds += 1
        failed_rounds += 1 if failed else 0
        seen = {"values": values, "failed": failed}
        if seen != last:
            say(event="values", t=time.time(), **seen)
            last = seen
        if stop or (until is not None and time.time() >= until):
            break
        time.sleep(every)
    say(event="done", t=time.time(), rounds=rounds, failed_rounds=failed_rounds)


if __name__ == "__main__":
    main()
