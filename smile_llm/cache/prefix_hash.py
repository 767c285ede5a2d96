"""Page hashes of token prefixes: a chain of 64-bit hashes, one per whole page, each of the page's
tokens and the hash before it (as vLLM's block hashes), so equal hashes mean equal prefixes up to
that page, whatever process computed them (``blake2b``, not Python's seeded ``hash``). A replica
publishes the hashes of the page-aligned prefixes its radix tree holds
(``RadixCache.page_prefix_hashes``); a router hashes a prompt the same way (``page_hashes``) and
scores each replica by the longest run of the prompt's hashes the replica holds
(``cached_pages``)."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Hashable, Iterable

import numpy as np

HASH_BYTES = 8


def seed_hash(extra_key: Hashable) -> bytes:
    """The hash a chain starts from: the namespace (``extra_key``) of the prefix."""
    return hashlib.blake2b(repr(extra_key).encode(), digest_size=HASH_BYTES).digest()


def chain(previous: bytes, page: np.ndarray) -> bytes:
    """The hash of a prefix one page longer than the one ``previous`` hashes."""
    h = hashlib.blake2b(previous, digest_size=HASH_BYTES)
    h.update(np.ascontiguousarray(page, dtype=np.int64).tobytes())
    return h.digest()


def page_hashes(tokens: Iterable[int], page_size: int, extra_key: Hashable = None) -> list[int]:
    """The hash of each whole-page prefix of ``tokens`` (``len(tokens) // page_size`` of them):
    entry k hashes ``tokens[:(k + 1) * page_size]`` in namespace ``extra_key``."""
    arr = np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens,
                     dtype=np.int64)
    out, h = [], seed_hash(extra_key)
    for k in range(len(arr) // page_size):
        h = chain(h, arr[k * page_size : (k + 1) * page_size])
        out.append(int.from_bytes(h, "little"))
    return out


def cached_pages(prompt_hashes: list[int], held: Collection[int]) -> int:
    """How many leading pages of a prompt (its ``page_hashes``) a replica holding ``held`` has
    cached."""
    n = 0
    while n < len(prompt_hashes) and prompt_hashes[n] in held:
        n += 1
    return n
