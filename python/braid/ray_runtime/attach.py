"""``python -m braid.ray_runtime.attach``: the short-lived helper process that attaches a
trainer rank to its job for ``runtime.delivery: node``.

Reads a pickled ``{"config", "state", "client", "timeout_s"}`` from stdin, joins Ray,
creates or finds the job's actors, attaches the client and prints one line,
``BRAID-ATTACH {"job", "namespace", "socket", "host"}`` (or ``{"error", "message"}``), then exits
at once, skipping the Ray driver's shut-down (the job's actors are detached: they outlive
it), so that the helper neither holds its ~80 MB nor delays the trainer while the job's
host builds its first steps. The trainer itself never runs a Ray driver.
"""

from __future__ import annotations

import json
import os
import pickle
import sys

from braid.ray_runtime.client import ATTACH_MARK


def main() -> int:
    try:
        request = pickle.loads(sys.stdin.buffer.read())
        from braid.ray_runtime import job as jobs
        from braid.ray_runtime._ray import ray
        config = request["config"]
        jobs.connect(config)
        job = jobs.attach(config, request["state"], request["client"])
        name = ray.get(job.constructor.socket_name.remote(), timeout=request["timeout_s"])
        host = ray.get(job.constructor.host_identity.remote(), timeout=request["timeout_s"])
        answer = {"job": job.name, "namespace": job.namespace, "socket": name, "host": host}
    except Exception as exc:  # noqa: BLE001 - handed to the trainer, which raises it
        answer = {"error": type(exc).__name__, "message": str(exc)}
    print(ATTACH_MARK + json.dumps(answer), flush=True)
    return 1 if "error" in answer else 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)
