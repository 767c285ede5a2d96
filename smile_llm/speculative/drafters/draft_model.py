"""DraftModelDrafter: a smaller checkpoint of the same vocabulary drafts k tokens autoregressively
(the "draft model" method of vLLM and SGLang), with its own transformer and its own KV pool, prefix
reuse included.

The draft model's KV follows the request's true tokens:

- ``bind`` binds the prompt in the draft pool with ``bind_request``, matching the draft pool's
  prefix tree.
- ``absorb`` (after each of the target's prefill chunks) writes the draft KV of the positions the
  target just wrote, several rows right-padded into one forward, and once the whole prompt is
  written caches it in the draft tree (``cache_prefix``), so a request admitted next matches it in
  both pools.
- ``propose`` feeds each row's backlog, the positions from the end of its verified draft KV to
  ``last_pos`` (the round's accepted drafts and the bonus token; a whole run after plain steps),
  rows at different positions right-padded into one forward whose last real column gives draft 0;
  drafts 1..n-1 follow as one ``DraftChain`` over that KV, planned once, every row at its own
  position. The chain's K/V stay out of the pool, so the pool only ever holds the request's true
  tokens: the next round's backlog feeds the drafts the target kept, several positions in one
  forward.
- Padding written by a padded forward is sealed off with ``truncate_to`` before anything is fed
  again. ``release`` inserts the verified positions only (``finish_request`` with the true tokens up
  to there), so the draft tree never holds a rejected draft. A forward that raises advances nothing
  (``filled`` moves after success only), so what ``release`` inserts is whole even then.

A row's regions in the draft pool between two rounds (positions):

    [0, matched)               the draft tree's (shared, locked)
    [matched, filled)          private, computed from the request's true tokens
    [filled, written_end)      padding: sealed off at the next call, never inserted

Drafts are proposals only: the target's acceptance rule decides, so at temperature 0 the output
equals plain greedy decoding whatever the draft model is.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...attention.backend import companion_backend
from ...cache import KvCacheExhaustedError
from ...cache.layout import ceil_page
from ...models.checkpoint.config import MAX_SPECULATIVE_TOKENS, ModelConfig
from ..draft_chain import DraftChain
from ..draft_tree import DraftTree
from ..draft_row import DraftRow
from .draft_choice import choose_drafts, draft_buffers
from .registry import DrafterContext, LoadedModel



DEFAULT_TOKENS = 4  # drafts per round for requests that ask for the default
# draft-pool positions bound beyond what a row needs now (at bind and at each growth)
GROW_TOKENS = 64
CATCH_UP_CHUNK = 1024  # positions per forward when a row catches up alone
PADDED_CATCH_UP = 256  # prefill backlogs up to this long share one right-padded forward


@dataclass
class DraftModelState:
    """One request's binding in the draft pool (see the module docstring's region table).
    ``capacity``: the bound, page-aligned positions; ``final_len``: the most it grows to."""

    request_id: int
    final_len: int
    capacity: int
    filled: int
    written_end: int
    prompt_cached: bool = False


def check_vocabularies(draft_vocab: int, target_vocab: int) -> None:
    """ValueError naming both sizes unless they are equal (drafts are target token ids)."""
    if draft_vocab != target_vocab:
        raise ValueError(f"the draft model's vocabulary has {draft_vocab} tokens, the target's "
                         f"{target_vocab}; a draft model must share the target's tokenizer and "
                         "vocabulary size")


class DraftModelDrafter:
    """Drafts from ``draft`` (a ``LanguageModel`` loaded without a drafter: its transformer, KV pool
    and attention backend are this drafter's). ValueError when its vocabulary size differs from
    ``target_vocab_size``, for a hybrid draft model (its recurrent state cannot be rolled back by
    ``truncate_to``), or for ``num_speculative_tokens`` outside ``1..MAX_SPECULATIVE_TOKENS``.
    ``close()`` closes the draft model."""

    def __init__(self, draft: LoadedModel, target_vocab_size: int,
                 num_speculative_tokens: int = DEFAULT_TOKENS) -> None:
        n = num_speculative_tokens
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SPECULATIVE_TOKENS:
            raise ValueError("num_speculative_tokens must be an int in "
                             f"1..{MAX_SPECULATIVE_TOKENS}, got {n!r}")
        check_vocabularies(draft.transformer.vocab_size, target_vocab_size)
        if draft.config.is_hybrid:
            raise ValueError("a hybrid (DeltaNet) draft model is not supported: truncate_to cannot "
                             "roll back its recurrent state; use a dense checkpoint")
        self.model = draft
        self.transformer, self.pool, self.backend = draft.transformer, draft.pool, draft.backend
        # the draft chain's own backend: planned once per round for the history, so no other forward
        # may replan it
        self.chain_backend = companion_backend(draft.backend, self.pool.device)
        self.num_speculative_tokens = n

    @classmethod
    def load(cls, path: str | Path, target: DrafterContext,
             num_speculative_tokens: int = DEFAULT_TOKENS) -> DraftModelDrafter:
        """Load the checkpoint at ``path`` as a draft model for ``target`` (the target's parts, as a
        drafter factory gets them; its ``load_model`` loads the checkpoint): on the target's device,
        in its dtype, with a KV pool of the target's page size and about as many slots (rows of the
        target's ``max_seq_len``). The vocabulary is checked before any weight is read. ValueError
        as the constructor, or for a tensor-parallel target."""
        ctx = target
        if ctx.load_model is None:
            raise ValueError("a draft model needs a model loader (DrafterContext.load_model); "
                             "load the target with "
                             "LanguageModel.from_pretrained(..., drafter=\"draft:PATH\")")
        if ctx.transformer.tp is not None:
            raise ValueError("a draft model is not supported with tensor_parallel > 1")
        check_vocabularies(ModelConfig.from_pretrained(Path(path)).vocab_size, ctx.vocab_size)
        device = ctx.pool.device
        draft = ctx.load_model(
            path, device=device, dtype=ctx.transformer.dtype, page_size=ctx.pool.page_size,
            max_batch_size=max(1, ctx.pool.num_slots // max(1, ctx.max_seq_len)),
            max_seq_len=ctx.max_seq_len,
            # what the target's pool left, less a margin
            mem_fraction=1.0 if device.type == "cuda" else None,
            cuda_graphs=False, drafter=None,
            compile=ctx.transformer.compiled is not None)  # as the target runs
        try:
            return cls(draft, ctx.vocab_size, num_speculative_tokens)
        except ValueError:
            draft.close()
            raise

    @staticmethod
    def state(seq: DraftRow) -> DraftModelState | None:
        """``seq``'s draft-pool state (None when this drafter does not serve it)."""
        h = seq.history
        assert h is None or isinstance(h, DraftModelState)
        return h

    # ------------------------------------------------------------------ binding
    def bind(self, seq: DraftRow, final_len: int) -> bool:
        """Bind ``seq``'s prompt in the draft pool (prefix match included) with room for
        ``GROW_TOKENS`` more positions; False (it then decodes plainly) when the draft pool cannot
        hold it."""
        want = min(final_len, len(seq.prompt) + GROW_TOKENS)
        try:
            rid = self.pool.bind_request(seq.prompt, want)
        except KvCacheExhaustedError:
            return False
        matched = self.pool.matched_prefix_len(rid)
        capacity = ceil_page(want, self.pool.page_size)
        seq.history = DraftModelState(rid, final_len, capacity, filled=matched, written_end=matched)
        return True

    def release(self, seq: DraftRow) -> None:
        """Insert ``seq``'s verified draft KV into the draft tree and unbind it. Does nothing when
        it is not bound."""
        st = self.state(seq)
        if st is None:
            return
        seq.history = None
        self.pool.finish_request(st.request_id, seq.tokens_between(0, st.filled))

    def close(self) -> None:
        self.model.close()

    def ready(self, seq: DraftRow) -> bool:
        """True when ``seq`` is bound and its draft row has room for its backlog up to ``last_pos``
        (the chain of later drafts writes nothing in the pool; grown on demand; False for this step
        when the draft pool is short)."""
        st = self.state(seq)
        if st is None:
            return False
        need = min(st.final_len, seq.last_pos + 1)
        if need <= st.capacity:
            return True
        try:
            st.capacity = self.pool.grow_request(st.request_id,
                                                 min(st.final_len, need + GROW_TOKENS))
        except KvCacheExhaustedError:
            return False
        return True

    def max_batch(self, n: int) -> int:
        return 1 << 30

    # ------------------------------------------------------------------ following the target
    def extend(self, seq: DraftRow, hidden: torch.Tensor, start: int) -> None:
        """Nothing: the draft model reads tokens, not the target's hidden states."""

    def commit(self, seq: DraftRow, hidden: torch.Tensor) -> None:
        """Nothing: what the target kept is read from ``seq.tokens`` at the next call."""

    def absorb(self, seqs: Sequence[DraftRow]) -> None:
        """Write the draft KV of the prompt positions the target has written (``seq.prefilled``),
        padded rows in one forward, and cache each whole prompt in the draft tree. When that draft
        forward raises, its rows stop drafting (released, with a RuntimeWarning naming the error)
        and decode plainly; the target's prefill is not failed for it."""
        items = []
        for seq in seqs:
            st = self.state(seq)
            if st is not None and st.filled < seq.prefilled:
                items.append((seq, st, seq.prefilled))
        try:
            self._feed(items, PADDED_CATCH_UP, logits=False)
        except Exception as exc:  # the draft model's failure: these rows go on without drafts
            warnings.warn(f"the draft model failed a prefill of {len(items)} row(s); they decode "
                          f"plainly: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            for seq, _, _ in items:
                self.release(seq)
        for seq in seqs:
            st = self.state(seq)
            if st is not None and not st.prompt_cached and st.filled >= len(seq.prompt):
                self.pool.cache_prefix(st.request_id, seq.prompt)
                st.prompt_cached = True

    # ------------------------------------------------------------------ drafting
    def propose(self, seqs: Sequence[DraftRow], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``n`` drafts for every (``ready``) row: seal off any padding, feed each row's backlog up
        to ``last_pos`` (draft 0 from its last position), then one chain step per further draft.
        Returns int64 ``[B, n]`` and the draft distributions for rows drafting by sampling."""
        drafts, probs, _ = self._draft(seqs, n)
        return drafts, probs

    def propose_tree(self, seqs: Sequence[DraftRow], branching: tuple[int, ...]) -> DraftTree:
        """A token tree per row (``draft_tree``): the chain of ``len(branching)`` drafts ``propose``
        makes, and at each depth j the draft model's next ``branching[j] - 1`` most likely tokens as
        leaves beside the chain's node (``DraftTree.chain_with_alternatives``). No extra draft
        forward; the chain's drafts the target keeps stay in the draft pool as in a linear round."""
        drafts, _, logits = self._draft(seqs, len(branching))
        return DraftTree.chain_with_alternatives(drafts, torch.stack(logits, dim=1), branching)

    def _draft(self, seqs: Sequence[DraftRow], n: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """``propose``'s drafts and distributions, and the draft model's logits ``[B, V]`` at each
        of the n depths."""
        states = []
        for seq in seqs:
            st = self.state(seq)
            assert st is not None, "propose needs ready rows"
            states.append(st)
        self._seal(seqs, states)
        for seq, st in zip(seqs, states):
            # draft 0 is read at last_pos (rewriting its KV if need be)
            st.filled = min(st.filled, seq.last_pos)
        logits = self._feed([(s, st, s.last_pos + 1) for s, st in zip(seqs, states)], n + 1,
                            logits=True)
        assert logits is not None
        last = np.array([s.last_pos for s in seqs], dtype=np.int64)
        drafts, probs = draft_buffers(seqs, n, logits.shape[-1], self.pool.device)
        choose_drafts(seqs, logits, last + 1, 0, drafts, probs)
        depths = [logits]
        # drafts 1..n-1: one chain over the rows' draft KV [0, last_pos], planned once (DraftChain)
        if n > 1:
            self.pool.activate_step(*[st.request_id for st in states])
            chain = DraftChain(self.transformer, self.pool, self.chain_backend, last + 1, n - 1)
            for d in range(1, n):  # draft d-1 goes in at its own position; its logits give draft d
                depths.append(chain.forward(drafts[:, d - 1 : d]).logits[:, -1])
                choose_drafts(seqs, depths[-1], last + 1 + d, d, drafts, probs)
        return drafts, probs, depths

    def _seal(self, seqs: Sequence[DraftRow], states: list[DraftModelState]) -> None:
        """Seal off any padding past ``filled`` with one ``truncate_to`` over the rows that have
        some."""
        rows = [st for st in states if st.written_end > st.filled]
        if rows:
            self.pool.activate_step(*[st.request_id for st in rows])
            self.pool.truncate_to(np.array([st.filled for st in rows], dtype=np.int64),
                                  np.array([st.written_end for st in rows], dtype=np.int64))
            for st in rows:
                st.written_end = st.filled

    def _feed(self, items: list[tuple[DraftRow, DraftModelState, int]], padded_limit: int,
              logits: bool) -> torch.Tensor | None:
        """Write the draft KV of every row's positions ``[filled, end)`` from its true tokens. A row
        with more than ``padded_limit`` of them catches up alone first (in chunks of
        ``CATCH_UP_CHUNK``), keeping its last position when ``logits``; the rest share one
        right-padded forward (a row whose padding would pass its capacity goes alone). With
        ``logits``: float32 ``[B, V]`` at each row's position ``end - 1``."""
        keep = 1 if logits else 0
        rows = []
        for seq, st, end in items:
            while end - keep - st.filled > padded_limit:
                self._write([(seq, st, min(end - keep, st.filled + CATCH_UP_CHUNK))])
            if st.filled < end:
                rows.append((seq, st, end))
        assert not logits or len(rows) == len(items), ("every row needs a position to read its "
                                                        "logits at")
        width = max((end - st.filled for _, st, end in rows), default=0)
        fits = [i for i, (_, st, _) in enumerate(rows) if st.filled + width <= st.capacity]
        groups = [fits] + [[i] for i in range(len(rows)) if i not in fits]
        out: list[torch.Tensor] = [torch.empty(0)] * len(rows)
        for group in groups:
            if group:
                got = self._write([rows[i] for i in group])
                for j, i in enumerate(group):
                    out[i] = got[j]
        return torch.stack(out) if logits and out else None

    def _write(self, items: list[tuple[DraftRow, DraftModelState, int]]) -> torch.Tensor:
        """One draft forward over positions ``[filled, end)`` of every row, right-padded to the
        longest (the padding's end goes into ``written_end``, sealed off at the next ``_seal``);
        ``filled`` moves to ``end`` once it returned. Returns the logits float32 ``[B, V]`` at each
        row's position ``end - 1``."""
        start = np.array([st.filled for _, st, _ in items], dtype=np.int64)
        size = np.array([end for _, _, end in items], dtype=np.int64) - start
        width = int(size.max())
        tokens = torch.zeros(len(items), width, dtype=torch.int64)
        for b, (seq, st, end) in enumerate(items):
            tokens[b, : size[b]] = torch.tensor(seq.tokens_between(st.filled, end))
            st.written_end = max(st.written_end, st.filled + width)
        self.pool.activate_step(*[st.request_id for _, st, _ in items])
        out = self.transformer(tokens.to(self.pool.device), start, self.pool, self.backend,
                               logit_cols=size - 1)
        for _, st, end in items:
            st.filled = end
        return out.logits[:, 0]
