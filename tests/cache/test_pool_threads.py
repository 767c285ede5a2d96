"""Several Python threads binding, finishing, offloading and allocating on one pool: every call is atomic under
the pool's lock, so the invariants hold throughout and every page is accounted for at the end.

Step verbs (activate_step + put) belong to one driver at a time (docs/contract.md, Conventions); the threads take
turns as the driver through ``driver`` while the others keep binding, finishing and allocating concurrently."""

from __future__ import annotations

import random
import threading

import numpy as np
import torch

from smile_llm.cache import KvCacheExhaustedError, KvCachePool

from .test_pool_stateful import value_of

PS = 4
SYSTEM = list(range(100, 112))


def worker(pool: KvCachePool, driver: threading.Lock, seed: int, rounds: int, errors: list[BaseException]) -> None:
    rng = random.Random(seed)
    try:
        for _ in range(rounds):
            prompt = SYSTEM[: rng.choice([4, 8, 12])] + [rng.randint(1, 5) for _ in range(rng.randint(1, 6))]
            try:
                rid = pool.bind_request(prompt, len(prompt) + rng.randint(0, 8))
            except KvCacheExhaustedError:
                continue
            assert pool.is_bound(rid) and pool.matched_prefix_len(rid) % PS == 0
            action = rng.random()
            seq = np.array(prompt, dtype=np.int64)
            with driver:
                pool.activate_step(rid)
                start = pool.kv_len(rid)
                vals = torch.tensor([value_of(seq[: p + 1]) for p in range(start, len(prompt))]).view(1, -1, 1, 1)
                pool.put(0, start, vals.expand(1, -1, 1, 2), -vals.expand(1, -1, 1, 2))
            if action < 0.3:
                handle = pool.offload_request(rid)
                try:
                    pool.restore_request(rid, handle)
                except KvCacheExhaustedError:
                    pass
            if action < 0.6:
                pool.finish_request(rid, prompt)
            else:
                pool.unbind_request(rid)
            assert not pool.is_bound(rid)
            try:
                slots = pool.alloc(rng.randint(1, 8))
                pool.free(slots)
            except KvCacheExhaustedError:
                pass
            if rng.random() < 0.2:
                pool.check_invariants()
                pool.evict(rng.randint(0, 8))
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def test_threads_binding_and_finishing_keep_invariants() -> None:
    pool = KvCachePool(1, 32 * PS, 1, 2, PS)
    errors: list[BaseException] = []
    driver = threading.Lock()
    threads = [threading.Thread(target=worker, args=(pool, driver, seed, 150, errors)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    pool.check_invariants()
    assert pool.bound_request_count == 0
    stats = pool.stats()
    assert stats["private_pages"] == stats["caller_pages"] == 0
    assert stats["free_pages"] + stats["tree_pages"] == 32
    assert stats["cached_tokens"] == stats["evictable_tokens"] == stats["tree_pages"] * PS
    assert stats["cached_tokens"] > 0 and pool.prefix_match_tokens > 0
    # Whatever the tree kept is the KV its tokens were written with.
    seq = np.array(SYSTEM + [1], dtype=np.int64)
    matched = pool.bind_with_prefix(seq, 16)
    k, _ = pool.get(0, matched)
    assert k[0, :, 0, 0].tolist() == [value_of(seq[: p + 1]) for p in range(matched)]
    pool.unbind_requests()
    pool.evict(10**6)
    assert np.array_equal(np.sort(pool._pages.free_list()), np.arange(32))
