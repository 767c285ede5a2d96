"""Token trees for speculative decoding: a round's drafts as a tree per row, its verify mask, and
its acceptance.

A round's window is ``[root, node_1 .. node_m]``: the root is the row's last token, node i a draft
whose parent ``parents[i - 1]`` is 0 (the root) or an earlier node. Window slot i holds node i, so
its KV is written at position ``start + i``, while its RoPE position is ``start + depth(i)`` (the
position the token would have on its path), and it attends to the context before the window and to
its own ancestors (and itself) only. One verify forward scores every node; acceptance walks from the
root, at each node taking the target's own choice of the next token (its argmax, or its draw with
the positional uniform of that position, exactly the draw plain decoding would make) and moving to
the child holding that token, until no child does; that choice is the bonus token. The accepted
nodes' KV is then moved to the consecutive positions after the root (``KvCachePool.move_kv``) and
the rest sealed with ``truncate_to``, so rejected branches are never attended nor inserted into the
prefix tree.

Because every emitted token is the target's own choice given the accepted path, the output equals
plain decoding token for token, greedy or seeded-sampled, whatever the tree holds.

``DraftTree.chain_with_alternatives`` builds the static shape ``branching = (b_1 .. b_k)`` from a
linear drafter: its chain of k drafts, and at depth j the next ``b_j - 1`` most likely tokens of its
depth-j distribution as leaf alternatives beside the chain's node (a rejected chain draft still gets
a second chance at that depth).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

MAX_TREE_NODES = 32  # drafts one row's tree may hold (each costs a verify position)
MAX_BRANCHING = 8  # alternatives per depth


def tree_nodes(branching: tuple[int, ...]) -> int:
    """Nodes of the ``chain_with_alternatives`` shape: the sum of the branching factors."""
    return sum(branching)


@dataclass(frozen=True)
class DraftTree:
    """One round's drafts for B rows as trees of m nodes each: ``tokens`` int64 ``[B, m]`` (node
    i + 1 of row b is ``tokens[b, i]``) and ``parents`` int64 ``[B, m]`` (node i + 1's parent: 0 for
    the root or an earlier node, ``parents[b, i] <= i``). Rows may have different shapes of the same
    size. ``sizes`` (int64 ``[B]``, default m each): row b's own nodes; the rest of its row is
    padding (copies acceptance never reaches, e.g. of its first node), verified but not counted as
    drafts."""

    tokens: torch.Tensor
    parents: np.ndarray
    sizes: np.ndarray | None = None

    def __post_init__(self) -> None:
        b, m = self.tokens.shape if self.tokens.dim() == 2 else (0, 0)
        if (self.tokens.dim() != 2 or self.tokens.dtype != torch.int64
                or self.parents.shape != (b, m)):
            raise ValueError("a draft tree needs int64 tokens [B, m] and parents [B, m], got "
                             f"{self.tokens.dtype} {list(self.tokens.shape)} and "
                             f"{list(self.parents.shape)}")
        if m and ((self.parents < 0).any() or (self.parents > np.arange(m)).any()):
            raise ValueError(f"draft tree parents must name the root (0) or an earlier node, got "
                             f"{self.parents.tolist()}")
        if self.sizes is not None and (np.shape(self.sizes) != (b,) or
                                       (np.asarray(self.sizes) < 1).any() or
                                       (np.asarray(self.sizes) > m).any()):
            raise ValueError(f"draft tree sizes must be one count in 1..{m} per row, "
                             f"got {self.sizes!r}")

    def row_size(self, row: int) -> int:
        """Row ``row``'s own nodes (the rest of its row is padding)."""
        return self.size if self.sizes is None else int(self.sizes[row])

    @property
    def size(self) -> int:
        """Nodes per row (m)."""
        return int(self.tokens.shape[1])

    def depths(self) -> np.ndarray:
        """int64 ``[B, m + 1]``: each window slot's depth (the root's is 0)."""
        b, m = self.parents.shape
        depth = np.zeros((b, m + 1), dtype=np.int64)
        rows = np.arange(b)
        for i in range(m):
            depth[:, i + 1] = depth[rows, self.parents[:, i]] + 1
        return depth

    def walk(self, row: int, slots: tuple[int, ...]) -> TreeWalk:
        """What acceptance's walk along ``slots`` (row ``row``'s accepted path, in depth order)
        chose from at each node (``TreeWalk``)."""
        # slot order: the drafter's own first
        children = [list(c.values()) for c in self.children(row)]
        path = [0, *slots]
        ranks = tuple(children[p].index(s) for p, s in zip(path, slots))
        offered = tuple(len(children[p]) for p in path if children[p])
        return TreeWalk(ranks, offered[: len(slots) + 1], self.size)

    def ancestry(self) -> np.ndarray:
        """bool ``[B, m + 1, m + 1]``: slot i sees slot j (j is i or one of its ancestors)."""
        b, m = self.parents.shape
        seen = np.zeros((b, m + 1, m + 1), dtype=bool)
        seen[:, 0, 0] = True
        rows = np.arange(b)
        for i in range(m):
            seen[:, i + 1] = seen[rows, self.parents[:, i]]
            seen[:, i + 1, i + 1] = True
        return seen

    def paths(self, row: int) -> list[list[int]]:
        """For every window slot of ``row``: the drafted tokens on its path from the root (the
        root's is empty)."""
        toks = self.tokens[row].tolist()
        par = self.parents[row].tolist()
        out: list[list[int]] = [[]]
        for i in range(len(toks)):
            out.append(out[par[i]] + [toks[i]])
        return out

    def children(self, row: int) -> list[dict[int, int]]:
        """For every slot of ``row``: its children, token -> slot (the first node holding a token
        wins)."""
        out: list[dict[int, int]] = [{} for _ in range(self.size + 1)]
        for i, (p, t) in enumerate(zip(self.parents[row].tolist(), self.tokens[row].tolist())):
            out[p].setdefault(t, i + 1)
        return out

    @classmethod
    def chain_with_alternatives(cls, chain: torch.Tensor, logits: torch.Tensor,
                                branching: tuple[int, ...]) -> DraftTree:
        """The static shape ``branching`` over a linear chain: ``chain`` int64 ``[B, k]``
        (k = len(branching)) and the drafter's logits at each depth ``[B, k, V]``. Depth j holds the
        chain's node, then the ``b_j - 1`` most likely other tokens as leaves under the same
        parent."""
        bsz, k = chain.shape
        if len(branching) != k:
            raise ValueError(f"branching {branching} has {len(branching)} depths, the chain {k}")
        tokens: list[torch.Tensor] = []
        parents: list[np.ndarray] = []
        prev = 0  # the chain node of the previous depth (0: the root)
        for j, b in enumerate(branching):
            node = len(tokens) + 1
            tokens.append(chain[:, j])
            parents.append(np.full(bsz, prev))
            if b > 1:
                # not the chain's
                ranked = logits[:, j].float().scatter(-1, chain[:, j : j + 1], float("-inf"))
                alternatives = ranked.topk(b - 1, dim=-1).indices
                for a in range(b - 1):
                    tokens.append(alternatives[:, a])
                    parents.append(np.full(bsz, prev))
            prev = node
        return cls(torch.stack(tokens, dim=1).to(torch.int64),
                   np.stack(parents, axis=1).astype(np.int64))


@dataclass(frozen=True)
class TreeWalk:
    """A row's tree round as a draft policy sees it (``DraftTree.walk``). At each node of the
    accepted path, from the root: ``offered[d]`` children to choose from, in slot order (in
    ``chain_with_alternatives`` and the n-gram tries the first is the drafter's own continuation,
    the others its alternatives), and where the walk went on, ``ranks[d]``, the index of the child
    taken (0: the drafter's own). ``offered`` has one entry more than ``ranks`` when the walk
    stopped at a node that had children (none of them the target's token). ``nodes``: the verify
    window's drafts (the round's tree size)."""

    ranks: tuple[int, ...]
    offered: tuple[int, ...]
    nodes: int


def window_mask(tree: DraftTree, start: np.ndarray) -> torch.Tensor:
    """The verify forward's attention mask in FlashInfer's ``custom_mask`` format: for row b, the
    ``[m + 1, start_b + m + 1]`` block (every query sees the context before the window, then its
    ancestors and itself), row-major, concatenated over rows."""
    seen = tree.ancestry()
    blocks = []
    for b in range(len(start)):
        q = seen.shape[1]
        block = np.ones((q, int(start[b]) + q), dtype=bool)
        block[:, int(start[b]) :] = seen[b]
        blocks.append(block.reshape(-1))
    return torch.from_numpy(np.concatenate(blocks))


@dataclass(frozen=True)
class TreeAccept:
    """A row's accepted path: the window slots of its accepted drafts (in order) and the tokens the
    round adds (their tokens, then the bonus token)."""

    slots: tuple[int, ...]
    tokens: tuple[int, ...]

    @property
    def num_accepted(self) -> int:
        return len(self.slots)


def accept_tree(children: list[dict[int, int]], choose: Callable[[int], int]) -> TreeAccept:
    """Walk from the root: at slot s take ``choose(s)`` (the target's next token after slot s's
    path); move to the child holding it, or stop with it as the bonus token."""
    slot = 0
    slots: list[int] = []
    tokens: list[int] = []
    while True:
        token = choose(slot)
        tokens.append(token)
        nxt = children[slot].get(token)
        if nxt is None:
            return TreeAccept(tuple(slots), tuple(tokens))
        slots.append(nxt)
        slot = nxt
