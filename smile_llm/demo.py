"""The cache demo: a short multi-turn chat served through the pool, showing prefix reuse turn by
turn.

Each turn binds the whole conversation so far with ``bind_with_prefix``, writes K/V only for the
tokens the tree did not already hold, reads the full context back to check the reused prefix is
exactly what an earlier turn wrote, and finishes the request so the next turn can reuse it.
"""

from __future__ import annotations

import numpy as np
import torch

from .cache import KvCachePool


def _kv_for(tokens: np.ndarray, start: int, heads: int, head_dim: int, layer: int) -> torch.Tensor:
    """Stand-in K/V: a deterministic function of (token, position, layer), as a model's would be of
    the prefix."""
    pos = torch.arange(start, len(tokens), dtype=torch.float32)
    tok = torch.from_numpy(tokens[start:]).float()
    base = torch.sin(tok * 0.37 + pos * 0.011 + layer)[:, None, None]
    return (base * torch.linspace(0.5, 1.5, heads * head_dim).view(1, heads, head_dim)).unsqueeze(0)


def run_demo(turns: int = 6, seed: int = 7) -> dict:
    """Print a multi-turn, two-user chat of ``turns`` turns driven through a ``KvCachePool`` alone
    (random tokens from ``seed``, no model), showing per turn the prompt, the reused prefix, the
    computed tokens, the cached tokens and free pages. Asserts that every reused prefix reads back
    exactly as computed from scratch and checks the invariants after every turn. Returns the pool's
    ``stats()`` at the end."""
    rng = np.random.default_rng(seed)
    layers, heads, head_dim = 2, 2, 16
    pool = KvCachePool(layers, 64 * 16, heads, head_dim, page_size=16, fresh_page_fill="poison")
    system = rng.integers(1000, 2000, size=200)
    conversations = {name: [system.copy()] for name in ("alice", "bob")}
    print(f"{pool}\n")
    print(f"{'turn':>4} {'user':>6} {'prompt':>7} {'reused':>7} {'computed':>9} {'cached':>7} "
          f"{'free pages':>10}")
    for turn in range(turns):
        name = ("alice", "bob")[turn % 2]
        history = conversations[name]
        history.append(rng.integers(1, 1000, size=int(rng.integers(10, 60))))  # the user's message
        prompt = np.concatenate(history)
        reply = rng.integers(1, 1000, size=int(rng.integers(20, 80)))
        matched = pool.bind_with_prefix(prompt, len(prompt) + len(reply))
        sequence = np.concatenate([prompt, reply])
        written = len(sequence) - 1  # the last sampled token's KV is never computed
        for layer in range(layers):
            k = _kv_for(sequence[:written], matched, heads, head_dim, layer)
            pool.put(layer, matched, k, -k)
        for layer in range(layers):  # the reused prefix reads back exactly as computed from scratch
            got, _ = pool.get(layer, written)
            assert torch.equal(got, _kv_for(sequence[:written], 0, heads, head_dim, layer)), (
                "prefix KV mismatch")
        pool.finish_exclusive(sequence)
        pool.check_invariants()
        history.append(reply)
        print(f"{turn:>4} {name:>6} {len(prompt):>7} {matched:>7} {written - matched:>9} "
              f"{pool.radix.total_size():>7} {pool.free_pages:>10}")
    stats = pool.stats()
    print(f"\nprefix hit rate {stats['prefix_hit_rate']:.1%} "
          f"({stats['prefix_match_tokens']} of {stats['prefix_prompt_tokens']} prompt tokens "
          f"reused); tree holds {stats['cached_tokens']} tokens in {stats['tree_pages']} pages; "
          "invariants hold")
    pool.close()
    return stats
