"""A comparable picture of a pool's whole observable state, for "a raising call changed nothing" assertions.

The tree is captured canonically (per root-to-leaf path: tokens, slots, per-page lock counts and access times), so
a structural split that keeps the token-to-slot mapping compares equal, while any change of ownership, mapping,
locks, LRU order, counters or stored K/V does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from smile_llm.cache import KvCachePool, RadixCache


def radix_snapshot(radix: RadixCache) -> tuple[Any, ...]:
    paths = []
    stack = [(child, (), (), (), ()) for child in radix.root.children.values()]
    while stack:
        node, toks, slots, locks, times = stack.pop()
        n_pages = len(node.key) // radix.page_size
        toks = toks + tuple(node.key.tolist())
        slots = slots + tuple(node.value.tolist())
        locks = locks + (node.lock_ref,) * n_pages
        times = times + (node.last_access_time,) * n_pages
        if not node.children:
            paths.append((repr(node.extra_key), toks, slots, locks, times))
        stack.extend((c, toks, slots, locks, times) for c in node.children.values())
    return (tuple(sorted(paths)), radix.evictable_size, radix.protected_size)


def pool_snapshot(pool: KvCachePool, with_kv: bool = True) -> dict[str, Any]:
    table = pool._table
    snap: dict[str, Any] = {
        "free_list": pool._pages.free_list().tolist(),
        "owner": pool._pages.owner.tolist(),
        "holder": pool._pages.holder.tolist(),
        "bindings": [
            (b.request_id, b.page_ids.tolist(), b.capacity, b.matched_len, b.prefix_tokens.tolist(),
             table.kv_len_of(b), b.exclusive, id(b.offload) if b.offload is not None else None)
            for b in table
        ],
        "next_id": table.next_id,
        "step": pool._step.ids if pool._step is not None else None,
        "radix": radix_snapshot(pool._radix),
        "counters": (pool.prefix_prompt_tokens, pool.prefix_match_tokens, pool.prefix_insert_tokens,
                     pool.prefix_evict_tokens),
        "scales": (pool.k_scale, pool.v_scale),
        "reuse": pool.prefix_reuse_enabled,
        "states": [(sorted(st._slot_of.items()), list(st._free), sorted(st._offloaded)) for st in pool.state_pools],
    }
    if with_kv and pool.direct:
        snap["k"] = pool.key_cache.clone()
        snap["v"] = pool.value_cache.clone()
    elif with_kv:  # every side's storage, a packed pool's tails and which pages are quantized
        kv = pool._kv
        for name, sides in (("k", kv.k_sides), ("v", kv.v_sides)):
            for i, side in enumerate(sides):
                if side.packed:
                    for part, t in side.parts.items():
                        snap[f"{name}{i}.{part}"] = t.clone()
                    snap[f"{name}{i}.tails"] = side.tails.clone()
                else:
                    snap[f"{name}{i}"] = side.buffer.clone()
        snap["tail_of"] = kv.tails.tail_of.tolist()
        snap["packed_valid"] = kv.packed_valid.tolist()
    if with_kv:
        for i, st in enumerate(pool.state_pools):
            for name, buf in st.buffers.items():
                snap[f"state{i}.{name}"] = buf.clone()
    return snap


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in before:
        a, b = before[key], after[key]
        if isinstance(a, torch.Tensor):  # byte comparison: exact, and NaN-safe for poisoned pages
            assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), f"{key} changed"
        else:
            assert a == b, f"{key} changed:\n before={a}\n after ={b}"


def expect_unchanged(pool: KvCachePool, exc: type[BaseException], fn, *args, match: str | None = None,
                     **kwargs) -> BaseException:
    """Call ``fn(*args, **kwargs)``, assert it raises ``exc`` (message matching ``match``), that the pool's state is
    exactly as before and that its invariants hold. Returns the exception."""
    import pytest

    pool.check_invariants()
    before = pool_snapshot(pool)
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    assert_same_state(before, pool_snapshot(pool))
    pool.check_invariants()
    return info.value


__all__ = ["assert_same_state", "expect_unchanged", "pool_snapshot", "radix_snapshot", "np"]
