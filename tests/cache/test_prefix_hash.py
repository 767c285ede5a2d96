"""Page hashes of prefixes (what a replica publishes of its radix tree for a cache-aware router): the tree's summary
holds exactly the hashes of its page-aligned prefixes, a prompt's hashes match a replica's summary for as many
leading pages as the tree would match, evicted pages leave the summary, namespaces stay apart, and the hashes are
the same in another process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from smile_llm.cache.prefix_hash import cached_pages, page_hashes
from smile_llm.cache.radix import RadixCache


def brute(tree: RadixCache) -> set[int]:
    """Every page-aligned prefix of every root-to-node path, hashed independently."""
    out: set[int] = set()
    for node in tree.nodes():
        path, n = [], node
        while n is not None and n is not tree.root:
            path.append(n.key)
            n = n.parent
        tokens = np.concatenate(path[::-1])
        out.update(page_hashes(tokens, tree.page_size, node.extra_key))
    return out


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_the_summary_is_every_cached_page_prefix_and_matches_like_the_tree(page_size: int) -> None:
    rng = np.random.default_rng(page_size)
    tree = RadixCache(page_size)
    slot = 0
    for _ in range(40):
        n = int(rng.integers(1, 24))
        tokens = rng.integers(0, 5, n).tolist()  # a small alphabet: many shared prefixes and splits
        tree.insert(tokens, list(range(slot, slot + n)))
        slot += n
        held = tree.page_prefix_hashes()
        assert held == brute(tree)
        probe = rng.integers(0, 5, 30).tolist()
        assert cached_pages(page_hashes(probe, page_size), held) * page_size == tree.match_prefix(probe).length
    tree.evict(tree.evictable_size // 2)
    held = tree.page_prefix_hashes()
    assert held == brute(tree)
    for _ in range(20):
        probe = rng.integers(0, 5, 30).tolist()
        assert cached_pages(page_hashes(probe, page_size), held) * page_size == tree.match_prefix(probe).length
    tree.evict(tree.evictable_size)
    assert tree.page_prefix_hashes() == frozenset()


def test_namespaces_and_processes() -> None:
    tree = RadixCache(2)
    tree.insert([1, 2, 3, 4], [0, 1, 2, 3], extra_key="a")
    held = tree.page_prefix_hashes()
    assert cached_pages(page_hashes([1, 2, 3, 4], 2, "a"), held) == 2
    assert cached_pages(page_hashes([1, 2, 3, 4], 2, "b"), held) == 0
    assert cached_pages(page_hashes([1, 2, 3, 4], 2), held) == 0
    code = "from smile_llm.cache.prefix_hash import page_hashes; print(page_hashes([1, 2, 3, 4, 5], 2, 'a'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert other.stdout.strip() == str(page_hashes([1, 2, 3, 4, 5], 2, "a"))
    assert len(page_hashes([1, 2, 3, 4, 5], 2)) == 2 and page_hashes([1], 2) == []


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_the_summary_under_a_prompt_is_its_path_and_what_extends_it(page_size: int) -> None:
    """``page_prefix_hashes(under=prompt)``: exactly the hashes of the page prefixes on the prompt's matched path and
    of every cached sequence extending the node the match ends in; ``limit`` keeps parents before children."""
    rng = np.random.default_rng(10 + page_size)
    tree = RadixCache(page_size)
    seqs: list[list[int]] = []
    slot = 0
    for _ in range(30):
        n = int(rng.integers(1, 24))
        tokens = rng.integers(0, 4, n).tolist()
        tree.insert(tokens, list(range(slot, slot + n)))
        seqs.append(tokens)
        slot += n
    everything = tree.page_prefix_hashes()
    for _ in range(20):
        prompt = rng.integers(0, 4, int(rng.integers(0, 12))).tolist()
        matched = tree.match_prefix(prompt).length
        got = tree.page_prefix_hashes(under=prompt)
        # the brute force: page prefixes of cached sequences that agree with the prompt's matched part and extend
        # at least to the end of the node the match ends in
        want: set[int] = set()
        if matched:
            for node in tree.nodes():
                path, n = [], node
                while n is not None and n is not tree.root:
                    path.append(n.key)
                    n = n.parent
                full = np.concatenate(path[::-1]).tolist()
                if full[:matched] == prompt[:matched]:
                    want.update(page_hashes(full, page_size))
        assert got == want and got <= everything
        assert cached_pages(page_hashes(prompt, page_size), got) * page_size == matched
        if len(got) > 2:
            few = tree.page_prefix_hashes(under=prompt, limit=2)
            assert len(few) == 2 and few <= got
            assert cached_pages(page_hashes(prompt, page_size), few) == min(2, matched // page_size)
    assert tree.page_prefix_hashes(under=[]) == frozenset()
