"""NgramDrafter: prompt lookup decoding (vLLM's ``ngram`` method, HF's
``prompt_lookup_num_tokens``).

No draft model, no KV: the drafts are copied from the request's own tokens (prompt and output). For
the row's tokens ``t[0..L)`` it finds the longest suffix of length ``min_n..max_n`` that occurred
earlier (ending before the last token; overlaps allowed), the most recent occurrence among the
longest, and drafts what followed it. When the ``p`` tokens between that occurrence and the end are
fewer than ``n``, the copy runs on over the drafts themselves (draft j is ``t[e + 1 + j % p]``, as
if the text kept repeating with period ``p``), so every round has exactly ``n`` drafts. A row with
no match is not ``ready``: it takes a plain step, and tries again on the next one.

Drafts are greedy (no distributions): at temperature 0 the output equals plain greedy decoding, and
when sampling the target's samples decide what is kept.

``propose_tree`` drafts a dynamic token tree: the trie of what followed every earlier occurrence of
the matched suffix (the most recent first, whose copy is the linear draft and the tree's chain),
within the shape's nodes per depth. Text that repeats with variations (``self.x = x`` then
``self.y = y``) offers each variation as a branch; a suffix that occurred once gives the chain
alone, a smaller tree than the shape allows.
"""

from __future__ import annotations

from collections.abc import Sequence

from dataclasses import dataclass, field

import numpy as np
import torch

from ...models.checkpoint.config import MAX_SPECULATIVE_TOKENS
from ..draft_tree import DraftTree
from ..draft_row import DraftRow

DEFAULT_MIN_N = 5  # vLLM's prompt_lookup_min default
DEFAULT_MAX_N = 5  # vLLM's prompt_lookup_max default
DEFAULT_TOKENS = 3  # drafts per round for requests that ask for the default


MAX_OCCURRENCES = 16  # occurrences of the matched suffix a tree is built from (the most recent)


def find_ngram_match(tokens: np.ndarray, min_n: int, max_n: int) -> tuple[int, int] | None:
    """The continuation of the most recent earlier occurrence of the longest suffix of ``tokens``
    (int64 ``[L]``, all >= 0) of length ``min_n..max_n``: ``(start, period)`` with ``start = e + 1``
    for the occurrence ending at ``e <= L - 2`` and ``period = L - 1 - e``; None when no suffix of
    ``min_n`` tokens occurred earlier.

    >>> find_ngram_match(np.array([5, 6, 7, 9, 5, 6]), 1, 3)  # "5 6" ended at 1: continue with 7
    (2, 4)
    >>> find_ngram_match(np.array([1, 1, 1]), 1, 3)  # "1 1" ended at 1 (overlapping)
    (2, 1)
    >>> find_ngram_match(np.array([1, 2, 3]), 1, 3) is None
    True
    """
    matches = find_ngram_matches(tokens, min_n, max_n, 1)
    return matches[0] if matches else None


def find_ngram_matches(tokens: np.ndarray, min_n: int, max_n: int,
                       limit: int) -> list[tuple[int, int]]:
    """``find_ngram_match`` for up to ``limit`` occurrences of the longest matched suffix, the most
    recent first (empty when none has ``min_n`` tokens).

    >>> find_ngram_matches(np.array([5, 6, 7, 5, 6, 8, 5, 6]), 2, 2, 4)  # "5 6" ended at 4 and at 1
    [(5, 3), (2, 6)]
    """
    length = len(tokens)
    if length < min_n + 1:
        return []
    cand = length - 1  # occurrences may end at 0..L-2
    alive = np.ones(cand, dtype=bool)
    matched = np.zeros(cand, dtype=np.int64)  # suffix length matched at each end, capped at max_n
    for k in range(min(max_n, cand)):
        # an occurrence ending at e matches k + 1 tokens when t[e - k] == t[L - 1 - k] and it
        # matched k
        prev = tokens[: cand - k]
        alive[k:] &= prev == tokens[length - 1 - k]
        alive[:k] = False
        matched += alive
    best = int(matched.max())
    if best < min_n:
        return []
    ends = np.flatnonzero(matched == best)[::-1][:limit]
    return [(int(e) + 1, length - 1 - int(e)) for e in ends]


@dataclass
class NgramState:
    """One request's tokens in a growing buffer (``tokens[:length]`` = prompt + output so far) and
    the matches (``find_ngram_matches``, up to ``MAX_OCCURRENCES``, the most recent first) for the
    length it was last searched at."""

    tokens: np.ndarray  # int64[final_len]
    length: int = 0
    searched_at: int = -1
    matches: list[tuple[int, int]] = field(default_factory=list)


class NgramDrafter:
    """Prompt lookup drafting (see the module docstring). ``min_n``/``max_n``: the suffix lengths
    tried (vLLM's ``prompt_lookup_min``/``prompt_lookup_max``, default 5 and 5);
    ``num_speculative_tokens``: drafts per round for requests that ask for the default. ValueError
    unless ``1 <= min_n <= max_n`` and ``1 <= num_speculative_tokens <= MAX_SPECULATIVE_TOKENS``."""

    def __init__(self, min_n: int = DEFAULT_MIN_N, max_n: int = DEFAULT_MAX_N,
                 num_speculative_tokens: int = DEFAULT_TOKENS) -> None:
        for name, value in (("min_n", min_n), ("max_n", max_n),
                            ("num_speculative_tokens", num_speculative_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if min_n > max_n:
            raise ValueError(f"min_n ({min_n}) must not exceed max_n ({max_n})")
        if num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}, "
                             f"got {num_speculative_tokens}")
        self.min_n, self.max_n, self.num_speculative_tokens = min_n, max_n, num_speculative_tokens

    @staticmethod
    def state(seq: DraftRow) -> NgramState | None:
        h = seq.history
        assert h is None or isinstance(h, NgramState)
        return h

    def bind(self, seq: DraftRow, final_len: int) -> bool:
        """Give ``seq`` a token buffer of ``final_len``. Always True."""
        buf = np.zeros(max(final_len, len(seq.prompt)), dtype=np.int64)
        buf[: len(seq.prompt)] = seq.prompt
        seq.history = NgramState(buf, len(seq.prompt))
        return True

    def release(self, seq: DraftRow) -> None:
        if self.state(seq) is not None:
            seq.history = None

    def close(self) -> None:
        pass

    def max_batch(self, n: int) -> int:
        return 1 << 30

    def _matches(self, seq: DraftRow, st: NgramState) -> list[tuple[int, int]]:
        """The matches for ``seq``'s current tokens, the most recent first (searched once per
        length; empty when none)."""
        total = len(seq.prompt) + len(seq.tokens)
        if st.length < total:
            st.tokens[st.length : total] = seq.tokens[st.length - len(seq.prompt) :]
            st.length = total
        if st.searched_at != total:
            st.matches = find_ngram_matches(st.tokens[:total], self.min_n, self.max_n,
                                            MAX_OCCURRENCES)
            st.searched_at = total
        return st.matches

    def ready(self, seq: DraftRow) -> bool:
        """True when ``seq`` is bound and a suffix of at least ``min_n`` tokens occurred earlier."""
        st = self.state(seq)
        return st is not None and bool(self._matches(seq, st))

    def propose(self, seqs: Sequence[DraftRow], n: int) -> tuple[torch.Tensor, None]:
        """``n`` copied drafts per (``ready``) row: int64 ``[B, n]`` on the CPU, no
        distributions."""
        out = np.empty((len(seqs), n), dtype=np.int64)
        steps = np.arange(n)
        for b, seq in enumerate(seqs):
            st = self.state(seq)
            assert st is not None
            matches = self._matches(seq, st)
            assert matches, "propose needs ready rows"
            start, period = matches[0]
            out[b] = st.tokens[start + steps % period]
        return torch.from_numpy(out), None

    def propose_tree(self, seqs: Sequence[DraftRow], branching: tuple[int, ...]) -> DraftTree:
        """A trie per (``ready``) row of the continuations of up to ``MAX_OCCURRENCES`` occurrences
        of its matched suffix, the most recent first (its continuation, the linear draft, is the
        chain: slots 1..k), each ``len(branching)`` tokens long, with at most ``branching[j]`` nodes
        at depth j (a continuation stops where its depth is full). Rows with fewer nodes than the
        largest are padded with copies of their first node, which acceptance never reaches (the
        first child holding a token wins); ``DraftTree.sizes`` counts each row's own."""
        k = len(branching)
        steps = np.arange(k)
        rows: list[tuple[list[int], list[int]]] = []
        for seq in seqs:
            st = self.state(seq)
            assert st is not None, "propose_tree needs ready rows"
            tokens, parents = [], []
            child: dict[tuple[int, int], int] = {}  # (parent slot, token) -> slot
            depth_nodes = [0] * k
            for start, period in self._matches(seq, st):
                parent = 0
                for j, token in enumerate(st.tokens[start + steps % period].tolist()):
                    slot = child.get((parent, token))
                    if slot is None:
                        if depth_nodes[j] >= branching[j]:
                            break
                        tokens.append(token)
                        parents.append(parent)
                        slot = child[(parent, token)] = len(tokens)
                        depth_nodes[j] += 1
                    parent = slot
            rows.append((tokens, parents))
        m = max(len(t) for t, _ in rows)
        out_tokens = np.array([t + [t[0]] * (m - len(t)) for t, _ in rows], dtype=np.int64)
        out_parents = np.array([p + [0] * (m - len(p)) for _, p in rows], dtype=np.int64)
        return DraftTree(torch.from_numpy(out_tokens), out_parents,
                         np.array([len(t) for t, _ in rows]))

    def extend(self, seq: DraftRow, hidden: torch.Tensor, start: int) -> None:
        pass

    def absorb(self, seqs: Sequence[DraftRow]) -> None:
        pass

    def commit(self, seq: DraftRow, hidden: torch.Tensor) -> None:
        pass
