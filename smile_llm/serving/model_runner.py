"""ModelRunner: the forward passes of generation over the rows bound in the model's pool(s).

``prefill`` (one request's prompt, in chunks) and ``step`` (one forward for a ragged batch: a plain
decode, or a speculative round for the rows that can draft: the drafter's drafts, one verify forward
over each row's window ``[last, d_0..d_{n-1}]`` or token tree, acceptance, ``truncate_to`` so
rejected positions are neither attended nor inserted) are used alike by ``LanguageModel.generate``
(one row) and the engine (many). Every forward's hidden states are reported to the drafter
(``drafters.Drafter``: extend / absorb / commit), whichever it is, so drafting stays possible after
any mix of steps.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..attention.backend import AttentionBackend
from ..cache import KvCachePool
from ..errors import GrammarError

from ..sampling.next_tokens import choose_next
from ..speculative.draft_policy import DraftPolicy, ThroughputPolicy
from ..speculative.draft_tree import (DraftTree, TreeAccept, window_mask)
from ..speculative.drafters import Drafter
from ..speculative.drafters.guarded_drafter import GuardedDrafter
from ..speculative.guarded_policy import GuardedPolicy
from ..speculative.row_acceptance import accept_tree_row, accept_window
from .request_row import MAX_FORCED_TOKENS, RequestRow
from .segments import SegmentRegistry
from ..speculative.acceptance import AcceptResult, RoundRecord
from ..models.transformer import ForwardOutput, Transformer
from .cuda_graphs import DecodeGraphRunner, VerifyGraphRunner

PREFILL_CHUNK = 1024  # prompt tokens per forward: bounds activation memory on long prompts
# a prompt left with at most this many positions may be prefilled with others
BATCHED_PREFILL_TOKENS = 256
# a padded prefill batch computes at most this many positions per real prompt position,
PADDING_WASTE = 1.25
# plus this many (short windows cost their per-forward overhead, not their positions)
PADDING_FREE = 64


class ModelRunner:
    """``decode_graphs`` / ``verify_graphs`` (CUDA only, see ``smile_llm.serving.cuda_graphs``)
    replay captured forwards for eligible batches; everything else runs eagerly."""

    def __init__(self, transformer: Transformer, pool: KvCachePool, backend: AttentionBackend,
                 drafter: Drafter | None, decode_graphs: DecodeGraphRunner | None = None,
                 verify_graphs: VerifyGraphRunner | None = None) -> None:
        self.transformer, self.pool, self.backend = transformer, pool, backend
        # a null drafter without one
        self.drafting = GuardedDrafter(drafter, transformer.vocab_size)
        self.decode_graphs, self.verify_graphs = decode_graphs, verify_graphs
        # a step with more rows decodes plainly; None: no limit
        self.speculative_max_batch: int | None = None
        # k per round of rows with speculative_tokens="auto"
        self.policy = GuardedPolicy(ThroughputPolicy())
        # constrained rows append the tokens their grammar forces in one verify forward
        self.jump_forward = True
        # segments registered with the model, spliced into the prompts that name them
        self.segments = SegmentRegistry(transformer, pool, backend, PREFILL_CHUNK)

    @property
    def drafter(self) -> Drafter | None:
        """The model's drafter (None: plain decoding); setting it wraps the new one (before any
        request)."""
        return self.drafting.user

    @drafter.setter
    def drafter(self, drafter: Drafter | None) -> None:
        self.drafting = GuardedDrafter(drafter, self.transformer.vocab_size)

    @property
    def draft_policy(self) -> DraftPolicy:
        """The policy of rows with ``speculative_tokens="auto"`` (its failures contained by
        ``policy``)."""
        return self.policy.policy

    @draft_policy.setter
    def draft_policy(self, policy: DraftPolicy) -> None:
        self.policy = GuardedPolicy(policy)

    def _forward(self, tokens: torch.Tensor, start: np.ndarray,
                 graphs: DecodeGraphRunner | VerifyGraphRunner | None,
                 use_graph: bool, keep_states: bool = False) -> ForwardOutput:
        """The target forward of the active rows, replayed from a CUDA graph when ``use_graph``; a
        failed capture turns the runner off and the step runs eagerly. ``keep_states``: see
        ``Transformer.forward``."""
        if use_graph and graphs is not None:
            try:
                return graphs.forward(tokens, start)
            except Exception:
                if graphs.enabled:
                    raise
        return self.transformer(tokens, start, self.pool, self.backend, keep_states=keep_states)

    def _activate(self, seqs: list[RequestRow]) -> None:
        self.pool.activate_step(*[s.request_id for s in seqs])

    # ------------------------------------------------------------------ prefill
    def prefill(self, seq: RequestRow, max_positions: int | None = None) -> bool:
        """Prefill up to ``max_positions`` (default: all) of the prompt positions not yet written,
        in chunks of at most PREFILL_CHUNK; True once the whole prompt is written (``seq.logits``
        then predict the first token). A registered segment's positions are spliced, not computed
        (``SegmentRegistry.splice``, when the prefill reaches it; a chunk ends before it)."""
        end = len(seq.prompt) if max_positions is None else min(len(seq.prompt),
                                                                seq.prefilled + max_positions)
        while seq.prefilled < end:
            if seq.splices and seq.splices[0].offset <= seq.prefilled:
                self.segments.splice(seq)
                continue
            start, stop = seq.prefilled, min(end, seq.prefilled + PREFILL_CHUNK)
            if seq.splices:
                stop = min(stop, seq.splices[0].offset)
            self._activate([seq])
            x = torch.tensor([seq.prompt[start:stop]], dtype=torch.int64, device=self.pool.device)
            # logits at every prompt position, not just the last
            every = seq.prompt_logprobs is not None
            out = self.transformer(x, np.array([start], dtype=np.int64), self.pool, self.backend,
                                   logit_cols=None if every else np.array([stop - start - 1],
                                                                          dtype=np.int64))
            seq.logits = out.logits[:, -1]
            if every:
                seq.add_prompt_logprobs(out.logits[0], start)
            seq.forwards += 1
            seq.prefill_forwards += 1
            seq.prefilled = stop
            self.drafting.extend(seq, out.hidden[0], start)
            self.drafting.absorb([seq])
        seq.prefill_s = time.perf_counter() - seq.t0
        return seq.prefilled == len(seq.prompt)

    def prefill_batch(self, seqs: list[RequestRow]) -> None:
        """Prefill the unwritten prompt parts of several rows (none asking for prompt logprobs)
        in one forward (their logits then predict each first token). Rows may start at different
        positions (different prefix hits) and have different lengths: each window is right-padded to
        the longest, and the padding's K/V is sealed off with ``truncate_to`` (as a verify round
        seals rejected drafts), so every row keeps exactly its prompt. ValueError unless every row
        has 1..PREFILL_CHUNK prompt positions left and room for its padding
        (``padded_prefill_fits``)."""
        if not seqs:
            return
        start = np.array([s.prefilled for s in seqs], dtype=np.int64)
        rem = np.array([len(s.prompt) for s in seqs], dtype=np.int64) - start
        if not self.padded_prefill_fits(seqs):
            raise ValueError(f"prefill_batch needs 1..{PREFILL_CHUNK} prompt positions left per "
                             f"row and room for the padding, got remainders {rem.tolist()}")
        width = int(rem.max())
        self._activate(seqs)
        tokens = torch.zeros(len(seqs), width, dtype=torch.int64)
        for b, seq in enumerate(seqs):
            tokens[b, : rem[b]] = torch.tensor(seq.prompt[seq.prefilled :])
        out = self.transformer(tokens.to(self.pool.device), start, self.pool, self.backend,
                               logit_cols=rem - 1)
        self.pool.truncate_to(start + rem, start + width)
        for b, seq in enumerate(seqs):
            seq.logits = out.logits[b : b + 1, 0]
            seq.forwards += 1
            seq.prefill_forwards += 1
            seq.prefilled = len(seq.prompt)
            seq.prefill_s = time.perf_counter() - seq.t0
            self.drafting.extend(seq, out.hidden[b, : rem[b]], int(start[b]))
        self.drafting.absorb(seqs)

    @staticmethod
    def padded_prefill_fits(seqs: list[RequestRow]) -> bool:
        """Whether ``prefill_batch`` can take ``seqs``: each has 1..PREFILL_CHUNK prompt positions
        left, its padding to the longest stays inside its bound capacity, and none asks for prompt
        logprobs (those prefill alone, with logits at every position) or has a segment left to
        splice."""
        rem = [len(s.prompt) - s.prefilled for s in seqs]
        width = max(rem, default=0)
        return bool(seqs) and min(rem) >= 1 and width <= PREFILL_CHUNK and \
            all(s.prefilled + width <= s.capacity and s.prompt_logprobs is None and not s.splices
                for s in seqs)

    @staticmethod
    def padded_prefill_groups(seqs: list[RequestRow]) -> list[list[RequestRow]]:
        """``seqs`` split into groups ``prefill_batch`` can take, shortest remainders first, each
        computing at most ``PADDING_WASTE * real + PADDING_FREE`` positions for its ``real`` prompt
        positions (a group of one is a plain ``prefill``)."""
        groups: list[list[RequestRow]] = []
        real = 0
        for seq in sorted(seqs, key=lambda s: len(s.prompt) - s.prefilled):
            rem = len(seq.prompt) - seq.prefilled
            group = groups[-1] if groups else []
            if group and (len(group) + 1) * rem <= PADDING_WASTE * (real + rem) + PADDING_FREE and \
                    ModelRunner.padded_prefill_fits(group + [seq]):
                group.append(seq)
                real += rem
            else:
                groups.append([seq])
                real = rem
        return groups

    def prefill_together(self, seqs: list[RequestRow]) -> None:
        """Prefill the whole remaining prompts of ``seqs`` in as few forwards as the padding rules
        allow (``padded_prefill_groups``; a group of one is a plain ``prefill``). The callers then
        take each first token. A packed pool prefills each alone: padding that completes a page the
        prompt does not would quantize it, and its raw values would be gone once the padding is
        taken back."""
        groups = self.padded_prefill_groups(seqs) if not self.pool.packed else \
            [[seq] for seq in seqs]
        for group in groups:
            if len(group) == 1:
                self.prefill(group[0])
            else:
                self.prefill_batch(group)

    # ------------------------------------------------------------------ one step for a batch
    def step(self, seqs: list[RequestRow]) -> None:
        """Advance every row by one forward: rows that can draft speculate (grouped by draft
        count, one round per group; rows with ``speculative_tokens="auto"`` get their count or tree
        shape from ``draft_policy``; rows whose tree (the policy's, or the whole ``draft_tree``)
        fits take a token-tree round, grouped by shape), the others take a plain step together, as
        do rows whose drafter failed this round. A step of more than ``speculative_max_batch`` rows
        is all plain (the drafter keeps absorbing their forwards, so drafting resumes when the batch
        shrinks)."""
        groups: dict[int, list[RequestRow]] = {}
        trees: dict[tuple[int, ...], list[RequestRow]] = {}
        forced: list[tuple[RequestRow, list[int]]] = []
        plain = []
        limit = self.speculative_max_batch
        drafting = limit is None or len(seqs) <= limit
        for s in seqs:
            tokens = self._forced(s)
            if s.finished:  # its grammar failed
                continue
            if tokens:
                forced.append((s, tokens))
                continue
            budget = s.draft_budget() if drafting else 0
            ready = budget >= 1 and self.drafting.ready(s)
            choice: int | tuple[int, ...] = budget
            if ready and s.adaptive:
                choice = self.policy.choose(s, budget)
            if not ready or not choice:
                plain.append(s)
            elif isinstance(choice, tuple) and s.tree_fits(choice):  # the policy's tree
                trees.setdefault(choice, []).append(s)
            elif not s.adaptive and s.draft_tree is not None and s.tree_fits():
                # the request's tree
                trees.setdefault(s.draft_tree, []).append(s)
            else:  # a linear round (a tree that does not fit drafts its chain)
                groups.setdefault(len(choice) if isinstance(choice, tuple) else choice,
                                  []).append(s)
        for n, group in sorted(groups.items()):
            size = self.drafting.max_batch(n)
            for i in range(0, len(group), size):
                chunk = group[i : i + size]
                t0 = time.perf_counter()
                proposal = self.drafting.propose(chunk, n)
                if proposal is None:
                    # the drafter failed this round: these rows take a plain step
                    plain.extend(chunk)
                    continue
                drafts, draft_probs = proposal
                valid = self._grammar_valid(chunk, drafts)
                if min(valid) == 0:  # rows whose first draft the grammar forbids: no verify work
                    plain.extend(s for s, v in zip(chunk, valid) if v == 0)
                    keep = [b for b, v in enumerate(valid) if v]
                    if not keep:
                        continue
                    chunk, valid = [chunk[b] for b in keep], [valid[b] for b in keep]
                    drafts = drafts[keep]
                    draft_probs = None if draft_probs is None else draft_probs[keep]
                width = max(valid)  # the window ends where every row's grammar refused a draft
                t1 = time.perf_counter()
                results = self._verify(chunk, width, drafts[:, :width],
                                       None if draft_probs is None else draft_probs[:, :width])
                # the policy hears of its own rows only
                rows = [b for b, s in enumerate(chunk) if s.adaptive]
                if rows:
                    self.policy.observe_round([chunk[b] for b in rows], n,
                                              [results[b].num_accepted for b in rows],
                                              t1 - t0, time.perf_counter() - t1)
        for branching, group in trees.items():
            size = self.drafting.max_batch(len(branching))
            for i in range(0, len(group), size):
                chunk = group[i : i + size]
                t0 = time.perf_counter()
                tree = self.drafting.propose_tree(chunk, branching)
                if tree is None:
                    plain.extend(chunk)
                    continue
                t1 = time.perf_counter()
                accepted = self._verify_tree(chunk, branching, tree)
                # the policy hears of its own rows only
                rows = [b for b, s in enumerate(chunk) if s.adaptive]
                if rows:
                    self.policy.observe_tree([chunk[b] for b in rows], branching,
                                             [tree.walk(b, accepted[b].slots) for b in rows],
                                             t1 - t0, time.perf_counter() - t1)
        if forced:  # plain rows may share a jump-forward forward (a window of their last token)
            shared, plain = self._forced_groups(forced + [(s, []) for s in plain]), []
        else:
            shared = []
        for windows in shared:
            if all(not t for _, t in windows):  # plain rows alone: a decode step
                plain.extend(s for s, _ in windows)
                continue
            width = max(len(t) for _, t in windows)
            drafts = torch.zeros(len(windows), width, dtype=torch.int64)  # right-padded
            for b, (_, tokens) in enumerate(windows):
                drafts[b, : len(tokens)] = torch.tensor(tokens)
            self._verify([s for s, _ in windows], width, drafts, None, forced=True,
                         widths=[len(t) for _, t in windows])
        # eager while rows speculate: a decode replay after verify replays in one step is untested
        # on a GPU
        if plain:
            t0 = time.perf_counter()
            self.decode(plain, allow_graph=not groups and not trees and not forced)
            if any(s.adaptive for s in plain):
                self.policy.observe_plain(plain, time.perf_counter() - t0)

    # ------------------------------------------------------------------ plain step
    def decode(self, seqs: list[RequestRow], allow_graph: bool = True) -> None:
        """One plain step for every row: forward its last token, then sample and append the
        next one."""
        self._activate(seqs)
        tokens = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.int64,
                              device=self.pool.device)
        start = np.array([s.last_pos for s in seqs], dtype=np.int64)
        graphs = self.decode_graphs
        out = self._forward(tokens, start, graphs,
                            allow_graph and graphs is not None and graphs.eligible(start))
        logits = out.logits[:, -1]
        for b, seq in enumerate(seqs):
            seq.logits = logits[b : b + 1]
            seq.forwards += 1
            self.drafting.extend(seq, out.hidden[b], int(start[b]))
        # the choice batched across rows
        for seq, (token, logp) in zip(seqs, choose_next(seqs, logits)):
            seq.push(token, logp)  # (a row whose grammar failed meanwhile takes nothing)

    # ------------------------------------------------------------------ speculative round
    def _forced(self, seq: RequestRow) -> list[int]:
        """The tokens ``seq``'s grammar forces next (jump-forward), as many as its next window may
        hold; none for a free row, with ``jump_forward`` off, or before its first token. A grammar
        failure fails the row alone."""
        if not self.jump_forward or seq.grammar_state is None or not seq.tokens:
            return []
        room = min(MAX_FORCED_TOKENS, seq.remaining - 1, seq.capacity - seq.last_pos - 1)
        if room < 1:
            return []
        try:
            return seq.grammar_state.forced(room)
        except GrammarError as exc:
            seq.fail(exc)
            return []

    @staticmethod
    def _forced_groups(windows: list[tuple[RequestRow, list[int]]]
                       ) -> list[list[tuple[RequestRow, list[int]]]]:
        """Jump-forward windows grouped into right-padded verify forwards, shortest first: a group
        computes at most ``PADDING_WASTE * real + PADDING_FREE`` positions for its ``real`` ones,
        and every row's bound capacity holds the group's widest window (its padding is sealed off
        with the rejected positions)."""
        groups: list[list[tuple[RequestRow, list[int]]]] = []
        real = 0
        for seq, tokens in sorted(windows, key=lambda w: len(w[1])):
            group = groups[-1] if groups else []
            width = len(tokens)  # the widest so far (sorted)
            if group and (len(group) + 1) * (width + 1) <= \
                    PADDING_WASTE * (real + width + 1) + PADDING_FREE and \
                    all(s.last_pos + 1 + width <= s.capacity for s, _ in group):
                group.append((seq, tokens))
                real += width + 1
            else:
                groups.append([(seq, tokens)])
                real = width + 1
        return groups

    @staticmethod
    def _grammar_valid(seqs: list[RequestRow], drafts: torch.Tensor) -> list[int]:
        """Per row, how many of its drafts ``[B, n]`` its grammar admits in a row (all for a free
        row): a forbidden draft ends the proposal there. A grammar failure fails the row alone (its
        drafts are all verified, and it takes none)."""
        n = drafts.shape[1]
        if all(s.grammar_state is None for s in seqs):
            return [n] * len(seqs)
        rows = drafts.tolist()
        valid = []
        for seq, row in zip(seqs, rows):
            try:
                state = seq.grammar_state
                valid.append(n if state is None else state.valid_prefix(row))
            except GrammarError as exc:
                seq.fail(exc)
                valid.append(n)
        return valid

    def _verify(self, seqs: list[RequestRow], n: int, drafts: torch.Tensor,
                draft_probs: torch.Tensor | None, forced: bool = False,
                widths: list[int] | None = None) -> list[AcceptResult]:
        """Verify ``drafts`` ``[B, n]`` in one forward, accept per row, seal the accepted KV, append
        the tokens. ``forced``: the drafts are the tokens each row's grammar forces (jump-forward;
        acceptance keeps them all, as the grammar's mask allows nothing else), booked as forced
        tokens and reported to the drafter as target positions (``extend``), not as a round.
        ``widths``: each row's own drafts (the rest of its row is padding, never accepted)."""
        drafts = drafts.to(self.pool.device)
        draft_probs = None if draft_probs is None else draft_probs.to(self.pool.device)
        self._activate(seqs)
        last = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.int64,
                            device=self.pool.device)
        start = np.array([s.last_pos for s in seqs], dtype=np.int64)
        graphs = self.verify_graphs
        out = self._forward(torch.cat([last, drafts], dim=1), start, graphs,
                            graphs is not None and graphs.eligible(len(seqs)), keep_states=True)
        own = [n] * len(seqs) if widths is None else widths
        results = [accept_window(seq, drafts[b, : own[b]],
                                 None if draft_probs is None else draft_probs[b, : own[b]],
                                 out.logits[b, : own[b] + 1]) for b, seq in enumerate(seqs)]
        kept = np.array([r.num_accepted for r in results], dtype=np.int64)
        # KV of the window's kept positions stays
        self.pool.truncate_to(start + 1 + kept, start + n + 1)
        # a hybrid model: each row's DeltaNet state after its last kept position
        self.transformer.rewind(out, kept)
        drafted = drafts.tolist()
        for b, (seq, res) in enumerate(zip(seqs, results)):
            # the window's kept positions: the last token and the kept drafts
            kept_rows = slice(0, res.num_tokens)
            if forced:
                self._append_forced(seq, res, int(start[b]), out.hidden[b, kept_rows],
                                    out.logits[b, kept_rows])
                continue
            self._append_round(seq, RoundRecord(int(start[b]), n, tuple(drafted[b]),
                                                res.num_accepted, res.tokens),
                               n, out.hidden[b, kept_rows], out.logits[b, kept_rows])
        return results

    def _append_forced(self, seq: RequestRow, result: AcceptResult, start: int,
                       hidden: torch.Tensor, logits: torch.Tensor) -> None:
        """Book a jump-forward window of ``seq`` at ``start``: the drafter hears of its positions
        as of any target forward (``extend``), then the forced tokens and the bonus are appended as
        in a round (``_push_tokens``)."""
        seq.forwards += 1
        seq.forced_tokens += result.num_accepted
        self.drafting.extend(seq, hidden, start)
        self._push_tokens(seq, result.tokens, logits)

    def _append_round(self, seq: RequestRow, record: RoundRecord, proposed: int,
                      hidden: torch.Tensor, logits: torch.Tensor) -> None:
        """Book one verified round of ``seq`` (counters, its ``on_round`` hook), give the drafter
        the true hidden rows of the kept positions (``hidden`` ``[kept + 1, D]``) and append the
        round's tokens, each with the raw log-distribution of its position (``logits``
        ``[kept + 1, V]``) when the request wants logprobs."""
        seq.forwards += 1
        seq.rounds += 1
        seq.proposed += proposed
        seq.accepted += record.num_accepted
        seq.accept_lengths[len(record.tokens)] += 1
        seq.on_round(record)
        self.drafting.commit(seq, hidden)
        self._push_tokens(seq, record.tokens, logits)

    @staticmethod
    def _push_tokens(seq: RequestRow, tokens: tuple[int, ...], logits: torch.Tensor) -> None:
        """Append a window's ``tokens`` until one finishes ``seq``, each with the raw
        log-distribution of its position (``logits`` ``[len(tokens), V]``) when the request wants
        logprobs."""
        logp = torch.log_softmax(logits.float(), dim=-1) if seq.logprobs is not None else None
        for j, token in enumerate(tokens):
            if seq.push(token, None if logp is None else logp[j]):
                break

    # ------------------------------------------------------------------ token-tree round
    def _verify_tree(self, seqs: list[RequestRow], branching: tuple[int, ...],
                     tree: DraftTree) -> list[TreeAccept]:
        """Verify ``tree`` in one forward with the tree mask, accept the longest path the target
        follows (``draft_tree.accept_tree``), move the accepted nodes' KV to consecutive positions,
        seal the rest (``truncate_to``) and append the tokens."""
        tokens = tree.tokens.to(self.pool.device)
        m = tree.size
        self._activate(seqs)
        last = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.int64,
                            device=self.pool.device)
        start = np.array([s.last_pos for s in seqs], dtype=np.int64)
        out = self.transformer(torch.cat([last, tokens], dim=1), start, self.pool, self.backend,
                               offsets=tree.depths(), mask=window_mask(tree, start))
        depths = tree.depths()
        results = [accept_tree_row(seq, tree, b, depths[b], out.logits[b])
                   for b, seq in enumerate(seqs)]
        kept = np.array([r.num_accepted for r in results], dtype=np.int64)
        width = int(kept.max(initial=0))
        if width:  # the accepted nodes' KV to positions start + 1 .. start + kept, in path order
            dst = start[:, None] + 1 + np.arange(width)
            src = dst.copy()
            for b, r in enumerate(results):
                src[b, : len(r.slots)] = start[b] + np.array(r.slots)
            self.pool.move_kv(src, dst)
        self.pool.truncate_to(start + 1 + kept, start + 1 + m)
        drafted = tree.tokens.tolist()
        for b, (seq, res) in enumerate(zip(seqs, results)):
            path = [0, *res.slots]  # the root and the accepted nodes, in path order
            own = tree.row_size(b)  # the row's drafts, without the batch's padding
            record = RoundRecord(int(start[b]), own, tuple(drafted[b][:own]), res.num_accepted,
                                 res.tokens, tuple(int(p) for p in tree.parents[b, :own]))
            self._append_round(seq, record, len(branching), out.hidden[b, path],
                               out.logits[b, path])
        return results
