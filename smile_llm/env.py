"""The environment switches the project honours (Smile's documented ones), read in this one
place."""

from __future__ import annotations

import os


def zero_rejected_kv() -> bool:
    """``SMILE_MTP_ZERO_REJECTED_KV=1``: ``truncate_to`` zeroes the rejected tail of
    a verify window."""
    return os.environ.get("SMILE_MTP_ZERO_REJECTED_KV") == "1"


def cuda_graphs_enabled() -> bool:
    """``SMILE_CUDA_GRAPHS=0`` turns CUDA-graph replay of decode and verify forwards off
    (on by default)."""
    return os.environ.get("SMILE_CUDA_GRAPHS", "1") != "0"


def compile_setting() -> bool | None:
    """``SMILE_COMPILE=0`` runs models eagerly, ``SMILE_COMPILE=1`` compiles them (on CUDA too);
    None when unset (``from_pretrained``'s default applies)."""
    raw = os.environ.get("SMILE_COMPILE", "")
    return None if raw == "" else raw != "0"


def tp_check() -> bool:
    """``SMILE_TP_CHECK=1``: tensor-parallel followers compare their pools' digests with rank 0's
    before every forward (a debug check; off by default)."""
    return os.environ.get("SMILE_TP_CHECK") == "1"


def _positive_int(name: str) -> int | None:
    """``name`` as a positive int, or None when it is unset, empty or not a positive int."""
    try:
        value = int(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def tp_timeout_s(default: float) -> float:
    """``SMILE_TP_TIMEOUT_S``: how long a tensor-parallel collective may wait for the other
    ranks, in seconds (``default`` when unset). ValueError naming the variable when it is not a
    positive finite number."""
    raw = os.environ.get("SMILE_TP_TIMEOUT_S", "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"SMILE_TP_TIMEOUT_S must be a positive number of seconds, got {raw!r}")
    return value


def distributed_launch() -> bool:
    """True inside a distributed launch (``torchrun`` sets ``RANK`` and ``WORLD_SIZE``
    for every rank)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_rank() -> int:
    """``LOCAL_RANK`` (set by ``torchrun``): this rank's index among the ranks on its
    machine; 0 when unset."""
    try:
        return max(0, int(os.environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return 0


def world_size() -> int | None:
    """``WORLD_SIZE`` (set by ``torchrun`` for every rank): the number of processes of a distributed
    launch, or None outside one."""
    return _positive_int("WORLD_SIZE")


def usable_cores() -> int:
    """The CPU cores this process may run on: its CPU affinity (``taskset``, cgroup cpusets), or
    ``os.cpu_count()`` where the platform has no affinity call. At least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The torch intra-op threads a command uses without ``--threads``: ``OMP_NUM_THREADS`` when
    set to a positive int (``torchrun`` sets 1 unless the caller set it), else
    ``usable_cores()`` divided among the ranks on this machine (``LOCAL_WORLD_SIZE``, set by
    ``torchrun``), at least 1."""
    explicit = _positive_int("OMP_NUM_THREADS")
    if explicit is not None:
        return explicit
    return max(1, usable_cores() // (_positive_int("LOCAL_WORLD_SIZE") or 1))


def api_key() -> str | None:
    """``SMILE_LLM_API_KEY``: the key ``smile-llm serve`` requires when no ``--api-key`` or
    ``--api-key-file`` is given (unset or empty: none)."""
    return os.environ.get("SMILE_LLM_API_KEY") or None


def kv_fingerprint() -> bool:
    """``SMILE_KV_FINGERPRINT=1``: at every request's end, before its pages are released, log its
    per-layer KV fingerprints as JSON lines on the ``smile_llm.kv_fingerprint`` logger (a debug
    switch for prefix reuse, docs/kv_fingerprints.md; off by default). Read when a model's serving
    loop is created."""
    return os.environ.get("SMILE_KV_FINGERPRINT") == "1"
