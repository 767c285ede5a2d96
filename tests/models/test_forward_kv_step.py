"""A forward writes its KV through one ``KvCachePool.kv_step`` handle: the pool is asked once per forward, not once
per layer, ``put`` is never called, ``kv_len`` moves once the forward succeeded and not at all when it raised, and
the MTP draft step goes the same way on its own pool."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from smile_llm.attention.backend import select_backend
from smile_llm.cache import KvCachePool
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 97, "hidden_size": 32,
          "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True}


class CountingLock:
    """An RLock that counts how often it is taken."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.count = 0

    def __enter__(self) -> Any:
        self.count += 1
        return self.lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.lock.__exit__(*exc)


def model(layers: int, mtp_layers: int = 0) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({**CONFIG, "num_hidden_layers": layers, "mtp_num_hidden_layers": mtp_layers})
    return Transformer(cfg).eval()


def pool_for(m: Transformer, layers: int | None = None) -> KvCachePool:
    c = m.config
    pool = KvCachePool(layers or c.num_hidden_layers, 256, c.num_key_value_heads, c.head_dim, 4)
    pool.prefix_reuse_enabled = False
    return pool


def no_put(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a forward must not call pool.put")


def test_a_forward_takes_the_pool_lock_the_same_number_of_times_whatever_its_depth() -> None:
    counts = []
    backend = select_backend("cpu")
    for layers in (1, 4):
        m = model(layers)
        pool = pool_for(m)
        rid = pool.bind_request([1], 64)
        pool.put = no_put  # type: ignore[method-assign]
        lock = CountingLock()
        pool._lock = lock  # type: ignore[assignment]
        out = m(torch.tensor([[5, 6, 7]]), np.array([0]), pool, backend)
        assert out.logits.shape == (1, 3, 97) and pool.kv_len(rid) == 3
        before = lock.count
        m(torch.tensor([[8]]), np.array([3]), pool, backend)
        counts.append(lock.count - before)
        assert pool.kv_len(rid) == 4
        pool.check_invariants()
    assert counts[0] == counts[1]


def test_a_forward_that_raises_leaves_kv_len_where_it_was() -> None:
    m = model(2)
    pool = pool_for(m)
    backend = select_backend("cpu")
    rid = pool.bind_request([1], 64)
    m(torch.tensor([[5, 6, 7]]), np.array([0]), pool, backend)
    assert pool.kv_len(rid) == 3
    mlp = m.model.layers[1].mlp

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("out of memory")

    mlp.forward = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="out of memory"):
        m(torch.tensor([[8, 9]]), np.array([3]), pool, backend)  # layer 0 and 1 wrote K/V before the failure
    assert pool.kv_len(rid) == 3
    pool.check_invariants()
    del mlp.forward
    m(torch.tensor([[8, 9]]), np.array([3]), pool, backend)
    assert pool.kv_len(rid) == 5
    pool.check_invariants()


def test_the_forward_equals_one_put_per_layer() -> None:
    """The handle against the per-layer ``put`` path (the oracle) on a twin pool: same logits, K/V bytes, kv_len."""
    m = model(2)
    backend = select_backend("cpu")
    pools = [pool_for(m), pool_for(m)]
    ids = [[p.bind_request([1], 32), p.bind_request([2], 32)] for p in pools]
    hkv, d = m.config.num_key_value_heads, m.config.head_dim

    def forward(i: int, tokens: torch.Tensor, start: np.ndarray) -> torch.Tensor:
        pool = pools[i]
        ctx = m.context(pool, backend, start, tokens.shape[1])
        if i == 1:
            def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                pool.put(layer, start, k.clone(), v.clone())
                shape = (-1, pool.page_size, hkv, d)
                return backend.run(q.reshape(ctx.batch * ctx.seqlen, -1, d), pool.key_layer(layer).view(shape),
                                   pool.value_layer(layer).view(shape), k_scale=pool.k_scale, v_scale=pool.v_scale)
            ctx.attend = attend  # type: ignore[method-assign]
        with torch.inference_mode():
            return m.run(tokens, ctx).logits

    for i, pool in enumerate(pools):
        pool.activate_step(*ids[i])
    prompt = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 13, 14]])
    steps = [(prompt, np.array([0, 0])), None,  # None: seal row 1 at 3, so the rows decode at different positions
             (torch.tensor([[20], [21]]), np.array([5, 3])), (torch.tensor([[22, 23], [24, 25]]), np.array([6, 4]))]
    for step in steps:
        if step is None:
            for pool in pools:
                pool.seal_length([5, 3])
        else:
            logits = [forward(i, *step) for i in range(2)]
            # exact: the paths differ only in how K/V reach the pool (copies); every op after it is the same call
            assert torch.equal(logits[0], logits[1])
        assert [pools[0].kv_len(r) for r in ids[0]] == [pools[1].kv_len(r) for r in ids[1]]
        assert torch.equal(pools[0].key_cache, pools[1].key_cache)
        assert torch.equal(pools[0].value_cache, pools[1].value_cache)
        for pool in pools:
            pool.check_invariants()
    assert [pools[0].kv_len(r) for r in ids[0]] == [8, 6]


def test_the_mtp_draft_step_commits_on_its_own_pool() -> None:
    m = model(1, mtp_layers=1)
    backend = select_backend("cpu")
    target, draft = pool_for(m), pool_for(m, layers=1)
    target.bind_request([1], 32)
    rid = draft.bind_request([1], 32)
    out = m(torch.tensor([[5, 6, 7]]), np.array([0]), target, backend)
    draft.put = no_put  # type: ignore[method-assign]
    d = m.draft(torch.tensor([[6, 7]]), out.hidden[:, :2], np.array([0]), draft, backend)
    assert d.logits.shape == (1, 97) and d.hidden.shape == (1, 32)
    assert draft.kv_len(rid) == 2
    draft.check_invariants()
