"""The OpenAI-compatible server as a Ray Serve application: N ``ModelReplica`` replicas (one model
each, optionally split over tensor-parallel ranks in the replica's placement group) behind one
``Ingress``, whose handle routes by cached prefix (``CacheAwareRouter``) unless told otherwise.

- ``application(...)``: the application, for ``serve.run`` in Python;
- ``build_app(args)``: the same from a ``serve run`` config's ``args`` (docs/scale_out.md);
- ``serve_replicas(...)``: ``smile-llm serve --replicas N``: a local Ray instance running it
  until SIGTERM or Ctrl-C.

Ray Serve is the optional ``ray`` extra: ``require_ray`` says how to install it."""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import fields, replace
from typing import Any

from ..model_options import ModelOptions
from ..settings import ServerSettings

log = logging.getLogger("smile_llm.server")
APP_NAME = "smile-llm"
INSTALL_HINT = ("Ray Serve is not installed: pip install -e '.[ray]' in the smile-llm checkout "
                "(or pip install 'ray[serve]>=2.60,<3')")
ROUTERS = {
    "cache": "smile_llm.server.replicas.cache_router:CacheAwareRouter",
    "pow2": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
    # (its public alias, ray.serve.llm.request_router, imports vLLM or SGLang; the class does not)
    "prefix": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
              "PrefixCacheAffinityRouter",
}
STATS_PERIOD_S = 2.0  # how often each replica's complete cache summary is collected
HEALTH_CHECK_PERIOD_S = 2.0
MAX_ONGOING_REQUESTS = 64  # per replica: the router holds the rest


def require_ray() -> None:
    """ImportError with the one-line install hint when Ray Serve is missing."""
    try:
        import ray.serve  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL_HINT) from None


def application(options: ModelOptions, settings: ServerSettings, replicas: int = 2,
                router: str = "cache", cpus_per_replica: float = 1.0, gpus_per_replica: float = 0.0,
                stats_period_s: float = STATS_PERIOD_S,
                max_ongoing_requests: int = MAX_ONGOING_REQUESTS, ingress_retries: int = 2,
                stall_timeout_s: float = 30.0, router_kwargs: dict[str, Any] | None = None) -> Any:
    """The Ray Serve application: ``replicas`` copies of ``options``' model, each asking Ray for
    ``cpus_per_replica`` / ``gpus_per_replica`` per tensor-parallel rank; ``router``: "cache"
    (by cached prefix), "pow2" (Ray Serve's default) or "prefix" (Ray Serve LLM's
    ``PrefixCacheAffinityRouter``), with ``router_kwargs`` (its ``initialize_state``'s);
    ``stats_period_s``: how often each replica's complete cache summary is collected;
    ``max_ongoing_requests``: per replica (the router holds the rest); ``ingress_retries`` and
    ``stall_timeout_s``: the ingress's (``Ingress``). ValueError for a bad value, before Ray is
    touched."""
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {sorted(ROUTERS)}, got {router!r}")
    for name, value in (("replicas", replicas), ("max_ongoing_requests", max_ongoing_requests)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    require_ray()
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .ingress import Ingress
    from .replica import ModelReplica

    # decided here, in this process's environment, so every replica decides alike
    options = replace(options, compile=options.compiles)
    tp = options.tensor_parallel
    bundle = {"CPU": cpus_per_replica, **({"GPU": gpus_per_replica} if gpus_per_replica else {})}
    placement: dict[str, Any] = dict(placement_group_bundles=[bundle] * tp,
                                     placement_group_strategy="PACK") if tp > 1 else {}
    if options.threads is None:
        options = replace(options, threads=max(1, int(cpus_per_replica)))
    routing: dict[str, Any] = dict(
        request_router_class=ROUTERS[router], request_router_kwargs=router_kwargs or {},
        request_routing_stats_period_s=stats_period_s,
        request_routing_stats_timeout_s=max(stats_period_s, 5.0))
    model: Any = serve.deployment(
        ModelReplica, name="ModelReplica", num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        max_ongoing_requests=max_ongoing_requests,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        graceful_shutdown_timeout_s=max(settings.drain_timeout_s, 1.0),
        request_router_config=RequestRouterConfig(**routing),
        **placement)
    front: Any = serve.deployment(Ingress, name="Ingress", num_replicas=1,
                             ray_actor_options={"num_cpus": 0},
                             max_ongoing_requests=max(1000, replicas * max_ongoing_requests))
    return front.bind(model.bind(options, settings, cpus_per_replica, gpus_per_replica),
                      options, settings, ingress_retries, stall_timeout_s)


MODEL_ARGS = {f.name for f in fields(ModelOptions)}
SETTINGS_ARGS = {f.name for f in fields(ServerSettings)}
APP_ARGS = {"replicas", "router", "cpus_per_replica", "gpus_per_replica", "stats_period_s",
            "max_ongoing_requests", "ingress_retries", "stall_timeout_s", "router_kwargs"}


def build_app(args: dict[str, Any]) -> Any:
    """The application from a ``serve run`` config's ``args`` (or ``serve run
    smile_llm.server.replicas.ray_app:build_app key=value ...``): ``ModelOptions`` fields
    (``model``, ``kind``, ``drafter``, ``tensor_parallel``, ...), ``ServerSettings`` fields
    (``model_name``, ``api_key``, ...) and ``application``'s (``replicas``, ``router``, ...).
    ValueError naming an unknown key."""
    unknown = sorted(set(args) - MODEL_ARGS - SETTINGS_ARGS - APP_ARGS)
    if unknown:
        raise ValueError(f"unknown args {unknown}; known: "
                         f"{sorted(MODEL_ARGS | SETTINGS_ARGS | APP_ARGS)}")
    typed = {k: _typed(v) for k, v in args.items()}
    options = ModelOptions(**{k: v for k, v in typed.items() if k in MODEL_ARGS})
    settings = ServerSettings(**{k: v for k, v in typed.items() if k in SETTINGS_ARGS})
    return application(options, settings, **{k: v for k, v in typed.items() if k in APP_ARGS})


def _typed(value: Any) -> Any:
    """A ``key=value`` from the command line arrives as text: numbers and none become values."""
    if not isinstance(value, str):
        return value
    if value.lower() in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def serve_replicas(app: Any, host: str, port: int, num_cpus: int | None = None,
                   metrics_port: int | None = None) -> int:
    """Start a local Ray instance (``num_cpus``: what it may schedule; default: this machine's;
    ``metrics_port``: where Ray exports the metrics of every replica, Prometheus text at
    ``/metrics``; default: a port Ray picks) with Serve's HTTP proxy at ``host``:``port``, run
    ``app`` there until SIGTERM or SIGINT, then
    shut Serve down (each replica finishes its in-flight requests within its graceful timeout)
    and Ray. A signal while the replicas start stops the start-up. Returns 0."""
    require_ray()
    import ray
    from ray import serve

    stop = threading.Event()
    starting = [True]

    def on_signal(*_: Any) -> None:
        stop.set()
        if starting[0]:  # interrupt the wait for the replicas (unplaceable ones never run)
            raise KeyboardInterrupt

    export: dict[str, Any] = {} if metrics_port is None else {"_metrics_export_port": metrics_port}
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **export)
    # (after ray.init, which installs its own handlers)
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        serve.start(http_options={"host": host, "port": port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
            starting[0] = False
            log.info("serving %s at http://%s:%d", APP_NAME, host, port)
        except KeyboardInterrupt:
            log.info("stopped while starting")
        while not stop.wait(0.5):
            pass
        log.info("draining")
        serve.shutdown()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
