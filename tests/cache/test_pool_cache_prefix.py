"""``cache_prefix``: a bound request's written prefix enters the tree before it finishes (SGLang's
``cache_unfinished_req``), so a request bound next matches it; duplicates are swapped for the tree's pages."""

from __future__ import annotations

import pytest
import torch

from smile_llm.cache import KvCachePool

from .snapshot import assert_same_state, expect_unchanged, pool_snapshot

PS = 4


def pool() -> KvCachePool:
    return KvCachePool(num_layers=2, num_slots=64, num_kv_heads=1, head_dim=2, page_size=PS)


def write(p: KvCachePool, rid: int, tokens: list[int], start: int = 0) -> None:
    """K = V = the token id at every position written."""
    p.activate_step(rid)
    x = torch.tensor(tokens[start:], dtype=torch.float32)[None, :, None, None].expand(1, -1, 1, 2)
    for layer in range(2):
        p.put(layer, start, x, x)


def test_second_request_matches_the_first_before_it_finishes() -> None:
    p = pool()
    prompt_a = list(range(10, 21))  # 11 tokens: 2 full pages
    a = p.bind_request(prompt_a, 16)
    write(p, a, prompt_a)
    assert p.cache_prefix(a, prompt_a) == 8
    p.check_invariants()
    assert p.matched_prefix_len(a) == 8 and p.radix.total_size() == 8
    b = p.bind_request(prompt_a[:9] + [99, 98], 16)
    p.check_invariants()
    assert p.matched_prefix_len(b) == 8
    p.activate_step(b)
    k, _ = p.get(0, 8)
    assert k[0, :, 0, 0].tolist() == [float(t) for t in prompt_a[:8]]  # a's KV, read through the tree's pages
    with pytest.raises(ValueError):  # the shared pages are below b's matched prefix now
        p.put(0, 4, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    assert p.cache_prefix(a, prompt_a) == 0  # nothing new
    p.finish_request(a, prompt_a + [30, 31])
    p.finish_request(b, None)
    p.check_invariants()
    assert p.bound_request_count == 0 and p.radix.total_size() == 8


def test_pages_the_tree_already_holds_are_swapped_and_freed() -> None:
    p = pool()
    prompt = list(range(40, 53))  # 13 tokens: 3 full pages
    a = p.bind_request(prompt, 16)
    c = p.bind_request(prompt, 16)  # bound before anything is cached: computes the same prefix privately
    write(p, a, prompt)
    write(p, c, prompt)
    free_before = p.free_pages
    assert p.cache_prefix(a, prompt) == 12
    assert p.cache_prefix(c, prompt) == 0  # c's 3 pages duplicate the tree's: swapped in, then freed
    p.check_invariants()
    assert p.free_pages == free_before + 3
    assert p.matched_prefix_len(c) == 12
    p.activate_step(c)
    k, _ = p.get(1, 13)
    assert k[0, :, 0, 0].tolist() == [float(t) for t in prompt]
    write(p, c, prompt + [7], start=13)  # c decodes on past its cached prefix
    p.finish_request(c, prompt + [7])
    p.finish_request(a, prompt)
    p.check_invariants()


def test_bad_input_changes_nothing() -> None:
    p = pool()
    prompt = list(range(12))
    a = p.bind_request(prompt, 16)
    write(p, a, prompt)
    expect_unchanged(p, ValueError, p.cache_prefix, 999, prompt, match="Unknown request id")
    p.cache_prefix(a, prompt)
    expect_unchanged(p, ValueError, p.cache_prefix, a, [1, 2, 3, 4, 5, 6, 7, 8, 9],  # not the matched prefix
                     match="must start with the 12 matched")
    p.prefix_reuse_enabled = False
    before = pool_snapshot(p)
    assert p.cache_prefix(a, prompt) == 0
    assert_same_state(before, pool_snapshot(p))
    p.check_invariants()


def test_only_written_kv_is_cached() -> None:
    p = pool()
    prompt = list(range(20))
    a = p.bind_request(prompt, 24)
    write(p, a, prompt[:6])  # kv_len 6: one full page written
    assert p.cache_prefix(a, prompt) == 4
    assert p.radix.total_size() == 4
    p.check_invariants()
