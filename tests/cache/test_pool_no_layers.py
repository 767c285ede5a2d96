"""A pool of no layers (a pipeline stage without attention layers, or rank 0's view of the MTP head's pool on another
stage): every verb books pages, bindings, the prefix tree and the step exactly as a pool with layers does, and it holds
no K/V. ``layer_range`` is empty and ``local_layer`` refuses every layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCacheLayout, KvCachePool, LayerNotHeldError


def drive(pool: KvCachePool) -> list[str]:
    """The same calls on any pool: two binds sharing a prefix, steps, a verify-style truncate, finishes; the digest
    after each."""
    digests = []
    a = pool.bind_request(list(range(10)), 24)
    pool.activate_step(a)
    pool.kv_step(0, 10).commit()
    pool.truncate_to(np.array([9]), np.array([10]))
    pool.finish_request(a, list(range(9)))
    digests.append(pool.state_digest())
    b = pool.bind_request(list(range(8)) + [50, 51], 24)
    assert pool.matched_prefix_len(b) == 8
    pool.activate_step(b)
    pool.kv_step(8, 2).commit()
    digests.append(pool.state_digest())
    pool.unbind_request(b)
    pool.check_invariants()
    digests.append(pool.state_digest())
    return digests


def test_a_pool_of_no_layers_books_every_call_as_a_pool_with_layers() -> None:
    empty = KvCachePool(0, 64, 2, 8, 4, first_layer=3)
    full = KvCachePool(2, 64, 2, 8, 4, first_layer=3)
    assert empty.layer_range == range(3, 3) and empty.key_cache.numel() == 0
    assert drive(empty) == drive(full)
    for layer in (0, 3, 4):
        with pytest.raises(LayerNotHeldError, match=r"holds layers \[3, 3\)"):
            empty.local_layer(layer)
    assert full.local_layer(4) == 1


def test_an_allocated_layout_of_no_layers_gets_the_rows_it_serves() -> None:
    pool = KvCachePool.allocate(KvCacheLayout(0, 2, 8, 2, 32), "cpu", torch.float32, 0.85, 4)
    assert pool.num_layers == 0 and pool.num_slots == 64
