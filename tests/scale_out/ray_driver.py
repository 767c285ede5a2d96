"""The Ray driver of the ``ray``-marked tests, in a process of its own (so that the test process never starts Ray's
core worker, whose threads outlive ``ray.shutdown``): a local Ray instance (``num_cpus=2``) with Serve's HTTP proxy
on the given port and Ray's metrics on another, driven by one JSON command per line on stdin, each answered by one
JSON line on stdout.

    python -m tests.scale_out.ray_driver PORT METRICS_PORT

Commands (``op``): ``run`` (``options``: ModelOptions fields, ``settings``: ServerSettings fields, ``app``:
``application``'s keywords), ``running`` (model replicas running, -1 while any is in another state), ``kill``
(``replica``: the unique id an answer's ``X-Smile-LLM-Replica`` names), ``ranks`` (tensor-parallel rank actors
alive), ``delete`` and ``quit``. A failed command answers ``{"error": ...}``."""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

APP = "smile-llm"


def handle(command: dict[str, Any]) -> Any:
    import ray
    from ray import serve

    op = command["op"]
    if op == "run":
        from smile_llm.server.model_options import ModelOptions
        from smile_llm.server.replicas.ray_app import application
        from smile_llm.server.settings import ServerSettings

        serve.run(application(ModelOptions(**command["options"]), ServerSettings(**command["settings"]),
                              **command["app"]), name=APP, route_prefix="/")
        return True
    if op == "running":
        states = serve.status().applications[APP].deployments["ModelReplica"].replica_states
        return int(states.get("RUNNING", 0)) if set(states) == {"RUNNING"} else -1
    if op == "kill":
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#ModelReplica#{command['replica']}", namespace="serve"),
                 no_restart=True)
        return True
    if op == "ranks":
        return len([a for a in ray.state.actors().values()  # type: ignore[attr-defined]
                    if a["ActorClassName"].endswith("TensorParallelRank") and a["State"] != "DEAD"])
    if op == "delete":
        serve.delete(APP)
        return True
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    import ray
    from ray import serve

    port, metrics_port = int(sys.argv[1]), int(sys.argv[2])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _metrics_export_port=metrics_port)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] == "quit":
                break
            try:
                reply = {"result": handle(command)}
            except Exception as exc:  # noqa: BLE001 - the test reads it
                reply = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
            print(json.dumps(reply), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
