"""Decoder: the forward passes of generation over sequences bound in the model's pool(s).

``prefill`` (one request's prompt, in chunks) and ``step`` (one forward for a ragged batch: a plain decode, or a
speculative round for the rows that can draft: the drafter's drafts, one verify forward over each row's window
``[last, d_0..d_{n-1}]`` or token tree, acceptance, ``truncate_to`` so rejected positions are neither attended nor
inserted) are used alike by ``LanguageModel.generate`` (one sequence) and the engine (many). Every forward's hidden states
are reported to the drafter (``drafters.Drafter``: extend / absorb / commit), whichever it is, so drafting stays
possible after any mix of steps.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
import torch

from ..attention.backend import AttentionBackend
from ..cache import KvCachePool

from .choice import choose_next
from .draft_policy import DraftPolicy, ThroughputPolicy
from .draft_tree import (MAX_BRANCHING, MAX_TREE_NODES, DraftTree, TreeAccept, accept_tree, tree_nodes,
                         window_mask)
from .drafters import Drafter
from .sampling import probabilities, sample
from .sequence import Sequence
from .speculative import AcceptResult, RoundRecord, accept_greedy, accept_rejection
from .transformer import ForwardOutput, Transformer

_P = TypeVar("_P")

PREFILL_CHUNK = 1024  # prompt tokens per forward: bounds activation memory on long prompts
BATCHED_PREFILL_TOKENS = 256  # a prompt left with at most this many positions may be prefilled with others
PADDING_WASTE = 1.25  # a padded prefill batch computes at most this many positions per real prompt position,
PADDING_FREE = 64  # plus this many (short windows cost their per-forward overhead, not their positions)


class Decoder:
    """``decode_graphs`` / ``verify_graphs`` (CUDA only, see ``smile_llm.model.graphs``) replay captured forwards
    for eligible batches; everything else runs eagerly."""

    def __init__(self, transformer: Transformer, pool: KvCachePool, backend: AttentionBackend,
                 drafter: Drafter | None, decode_graphs: Any = None, verify_graphs: Any = None) -> None:
        self.transformer, self.pool, self.backend, self.drafter = transformer, pool, backend, drafter
        self.decode_graphs, self.verify_graphs = decode_graphs, verify_graphs
        self.speculative_max_batch: int | None = None  # a step with more rows decodes plainly; None: no limit
        self.draft_policy: DraftPolicy = ThroughputPolicy()  # k per round of rows with speculative_tokens="auto"

    def _forward(self, tokens: torch.Tensor, start: np.ndarray, graphs: Any, use_graph: bool,
                 keep_states: bool = False) -> ForwardOutput:
        """The target forward of the active rows, replayed from a CUDA graph when ``use_graph``; a failed capture
        turns the runner off and the step runs eagerly. ``keep_states``: see ``Transformer.forward``."""
        if use_graph:
            try:
                return cast(ForwardOutput, graphs.forward(tokens, start))
            except Exception:
                if graphs.enabled:
                    raise
        return self.transformer(tokens, start, self.pool, self.backend, keep_states=keep_states)

    def _activate(self, seqs: list[Sequence]) -> None:
        self.pool.activate_step(*[s.request_id for s in seqs])

    # ------------------------------------------------------------------ prefill
    def prefill(self, seq: Sequence, max_tokens: int | None = None) -> bool:
        """Prefill up to ``max_tokens`` (default: all) of the prompt positions not yet written, in chunks of at
        most PREFILL_CHUNK; True once the whole prompt is written (``seq.logits`` then predict the first token)."""
        end = len(seq.prompt) if max_tokens is None else min(len(seq.prompt), seq.prefilled + max_tokens)
        while seq.prefilled < end:
            start, stop = seq.prefilled, min(end, seq.prefilled + PREFILL_CHUNK)
            self._activate([seq])
            x = torch.tensor([seq.prompt[start:stop]], dtype=torch.int64, device=self.pool.device)
            every = seq.prompt_logprobs is not None  # logits at every prompt position, not just the last
            out = self.transformer(x, np.array([start], dtype=np.int64), self.pool, self.backend,
                                   logit_cols=None if every else np.array([stop - start - 1], dtype=np.int64))
            seq.logits = out.logits[:, -1]
            if every:
                seq.add_prompt_logprobs(out.logits[0], start)
            seq.forwards += 1
            seq.prefill_forwards += 1
            seq.prefilled = stop
            if self.drafter is not None:
                self.drafter_call([seq], "extend", seq, out.hidden[0], start)
                self.drafter_call([seq], "absorb", [seq])
        seq.prefill_s = time.perf_counter() - seq.t0
        return seq.prefilled == len(seq.prompt)

    def prefill_batch(self, seqs: list[Sequence]) -> None:
        """Prefill the unwritten prompt parts of several sequences (none asking for prompt logprobs) in one forward
        (their logits then predict each first token). Rows may start at different positions (different prefix hits) and have different lengths:
        each window is right-padded to the longest, and the padding's K/V is sealed off with ``truncate_to`` (as a
        verify round seals rejected drafts), so every row keeps exactly its prompt. ValueError unless every row has
        1..PREFILL_CHUNK prompt positions left and room for its padding (``padded_prefill_fits``)."""
        if not seqs:
            return
        start = np.array([s.prefilled for s in seqs], dtype=np.int64)
        rem = np.array([len(s.prompt) for s in seqs], dtype=np.int64) - start
        if not self.padded_prefill_fits(seqs):
            raise ValueError(f"prefill_batch needs 1..{PREFILL_CHUNK} prompt positions left per row and room for "
                             f"the padding, got remainders {rem.tolist()}")
        width = int(rem.max())
        self._activate(seqs)
        tokens = torch.zeros(len(seqs), width, dtype=torch.int64)
        for b, seq in enumerate(seqs):
            tokens[b, : rem[b]] = torch.tensor(seq.prompt[seq.prefilled :])
        out = self.transformer(tokens.to(self.pool.device), start, self.pool, self.backend, logit_cols=rem - 1)
        self.pool.truncate_to(start + rem, start + width)
        for b, seq in enumerate(seqs):
            seq.logits = out.logits[b : b + 1, 0]
            seq.forwards += 1
            seq.prefill_forwards += 1
            seq.prefilled = len(seq.prompt)
            seq.prefill_s = time.perf_counter() - seq.t0
            if self.drafter is not None:
                self.drafter_call([seq], "extend", seq, out.hidden[b, : rem[b]], int(start[b]))
        if self.drafter is not None:
            self.drafter_call(seqs, "absorb", seqs)

    @staticmethod
    def padded_prefill_fits(seqs: list[Sequence]) -> bool:
        """Whether ``prefill_batch`` can take ``seqs``: each has 1..PREFILL_CHUNK prompt positions left, its
        padding to the longest stays inside its bound capacity, and none asks for prompt logprobs (those prefill
        alone, with logits at every position)."""
        rem = [len(s.prompt) - s.prefilled for s in seqs]
        width = max(rem, default=0)
        return bool(seqs) and min(rem) >= 1 and width <= PREFILL_CHUNK and \
            all(s.prefilled + width <= s.capacity and s.prompt_logprobs is None for s in seqs)

    @staticmethod
    def padded_prefill_groups(seqs: list[Sequence]) -> list[list[Sequence]]:
        """``seqs`` split into groups ``prefill_batch`` can take, shortest remainders first, each computing at
        most ``PADDING_WASTE * real + PADDING_FREE`` positions for its ``real`` prompt positions (a group of one is a
        plain ``prefill``)."""
        groups: list[list[Sequence]] = []
        real = 0
        for seq in sorted(seqs, key=lambda s: len(s.prompt) - s.prefilled):
            rem = len(seq.prompt) - seq.prefilled
            group = groups[-1] if groups else []
            if group and (len(group) + 1) * rem <= PADDING_WASTE * (real + rem) + PADDING_FREE and \
                    Decoder.padded_prefill_fits(group + [seq]):
                group.append(seq)
                real += rem
            else:
                groups.append([seq])
                real = rem
        return groups

    def prefill_together(self, seqs: list[Sequence]) -> None:
        """Prefill the whole remaining prompts of ``seqs`` in as few forwards as the padding rules allow
        (``padded_prefill_groups``; a group of one is a plain ``prefill``). The callers then take each first token."""
        for group in self.padded_prefill_groups(seqs):
            if len(group) == 1:
                self.prefill(group[0])
            else:
                self.prefill_batch(group)

    # ------------------------------------------------------------------ one step for a batch
    def step(self, seqs: list[Sequence]) -> None:
        """Advance every sequence by one forward: rows that can draft speculate (grouped by draft count, one
        round per group; rows with ``speculative_tokens="auto"`` get their count or tree shape from
        ``draft_policy``; rows whose tree (the policy's, or the whole ``draft_tree``) fits take a token-tree round,
        grouped by shape), the others take a plain step together,
        as do rows whose drafter failed this round. A step of more than ``speculative_max_batch`` rows is all plain
        (the drafter keeps absorbing their forwards, so drafting resumes when the batch shrinks)."""
        groups: dict[int, list[Sequence]] = {}
        trees: dict[tuple[int, ...], list[Sequence]] = {}
        plain = []
        limit = self.speculative_max_batch
        drafting = self.drafter is not None and (limit is None or len(seqs) <= limit)
        for s in seqs:
            budget = s.draft_budget() if drafting else 0
            ready = budget >= 1 and not s.drafter_failed and self.drafter is not None and \
                bool(self.drafter_call([s], "ready", s))
            choice: int | tuple[int, ...] = budget
            if ready and s.adaptive:
                choice = self._policy("choose", s, budget) or 0
            if not ready or not choice:
                plain.append(s)
            elif isinstance(choice, tuple) and s.tree_fits(choice):  # the policy's tree
                trees.setdefault(choice, []).append(s)
            elif not s.adaptive and s.draft_tree is not None and s.tree_fits():  # the request's tree
                trees.setdefault(s.draft_tree, []).append(s)
            else:  # a linear round (a tree that does not fit drafts its chain)
                groups.setdefault(len(choice) if isinstance(choice, tuple) else choice, []).append(s)
        for n, group in sorted(groups.items()):
            assert self.drafter is not None
            size = max(1, self.drafter.max_batch(n))
            for i in range(0, len(group), size):
                chunk = group[i : i + size]
                t0 = time.perf_counter()
                proposal = self._propose(chunk, lambda rows: self._linear_proposal(rows, n))
                if proposal is None:
                    plain.extend(chunk)  # the drafter failed this round: these rows take a plain step
                    continue
                t1 = time.perf_counter()
                results = self._verify(chunk, n, *proposal)
                rows = [b for b, s in enumerate(chunk) if s.adaptive]  # the policy hears of its own rows only
                if rows:
                    self._policy("observe_round", [chunk[b] for b in rows], n, [results[b].num_accepted for b in rows],
                                 t1 - t0, time.perf_counter() - t1)
        for branching, group in trees.items():
            assert self.drafter is not None
            size = max(1, self.drafter.max_batch(len(branching)))
            for i in range(0, len(group), size):
                chunk = group[i : i + size]
                t0 = time.perf_counter()
                tree = self._propose(chunk, lambda rows: self._tree_proposal(rows, branching))
                if tree is None:
                    plain.extend(chunk)
                    continue
                t1 = time.perf_counter()
                accepted = self._verify_tree(chunk, branching, tree)
                rows = [b for b, s in enumerate(chunk) if s.adaptive]  # the policy hears of its own rows only
                if rows:
                    self._policy("observe_tree", [chunk[b] for b in rows], branching,
                                 [tree.walk(b, accepted[b].slots) for b in rows], t1 - t0, time.perf_counter() - t1)
        if plain:  # eager while rows speculate: a decode replay after verify replays in one step is untested on a GPU
            t0 = time.perf_counter()
            self.decode(plain, allow_graph=not groups and not trees)
            if any(s.adaptive for s in plain):
                self._policy("observe_plain", plain, time.perf_counter() - t0)

    # ------------------------------------------------------------------ plain step
    def decode(self, seqs: list[Sequence], allow_graph: bool = True) -> None:
        """One plain step for every sequence: forward its last token, then sample and append the next one."""
        self._activate(seqs)
        tokens = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.int64, device=self.pool.device)
        start = np.array([s.last_pos for s in seqs], dtype=np.int64)
        graphs = self.decode_graphs
        out = self._forward(tokens, start, graphs, allow_graph and graphs is not None and graphs.eligible(start))
        logits = out.logits[:, -1]
        for b, seq in enumerate(seqs):
            seq.logits = logits[b : b + 1]
            seq.forwards += 1
            if self.drafter is not None:
                self.drafter_call([seq], "extend", seq, out.hidden[b], int(start[b]))
        for seq, (token, logp) in zip(seqs, choose_next(seqs, logits)):  # the choice batched across rows
            seq.push(token, logp)

    # ------------------------------------------------------------------ speculative round
    def _propose(self, seqs: list[Sequence], propose: Callable[[list[Sequence]], _P]) -> _P | None:
        """``propose(seqs)``, or None when the drafter raised or proposed something unusable: the round is dropped
        (each row's ``draft_errors`` counts it, with a RuntimeWarning naming the error) and the rows decode plainly
        this step. Drafts are only proposals, so nothing else changes."""
        try:
            return propose(seqs)
        except Exception as exc:  # the drafter's code: fail its round alone
            for seq in seqs:
                seq.draft_errors += 1
            warnings.warn(f"drafter {type(self.drafter).__name__} failed a round of {len(seqs)} row(s) and they "
                          f"decode plainly this step: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def drafter_call(self, seqs: list[Sequence], hook: str, *args: Any) -> Any:
        """``drafter.<hook>(*args)`` for the rows ``seqs``; when it raises, the drafter is done with them: each stops
        drafting (``drafter_failed``: no further hook but its ``release``) and counts a ``draft_errors``, a
        RuntimeWarning names the error, and None is returned. The target's work and the rows' tokens are
        unaffected. Every drafter hook of the decoder and the scheduler goes through here."""
        assert self.drafter is not None
        if hook != "release":  # a row whose drafter failed hears nothing more from it but its release
            live = [seq for seq in seqs if not seq.drafter_failed]
            if not live:
                return None
            if hook == "absorb":
                args = (live,)
        try:
            return getattr(self.drafter, hook)(*args)
        except Exception as exc:  # the drafter's code: the rows go on without it
            for seq in seqs:
                seq.draft_errors += 1
                seq.drafter_failed = True
            warnings.warn(f"drafter {type(self.drafter).__name__}.{hook} failed for {len(seqs)} row(s), which "
                          f"decode plainly from now on: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def _policy(self, method: str, *args: Any) -> Any:
        """``draft_policy.<method>(*args)``; a policy that raises (or chooses a count outside ``0 .. budget``)
        costs only its choice: a RuntimeWarning names the error and the row takes a plain step."""
        try:
            out = getattr(self.draft_policy, method)(*args)
            if method == "choose":
                self._check_choice(out, *args)
            return out
        except Exception as exc:  # the caller's policy: never the request's failure
            warnings.warn(f"draft policy {type(self.draft_policy).__name__}.{method} failed: "
                          f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            return None

    def _check_choice(self, out: Any, seq: Sequence, budget: int) -> None:
        """ValueError unless ``out`` is a draft count in ``0 .. budget`` or, for a row with ``tree_rounds`` and a
        policy with ``observe_tree``, a tree shape of at most ``budget`` depths within the tree limits."""
        if isinstance(out, tuple):
            if not seq.tree_rounds:
                raise ValueError(f"chose the token tree {out!r} for a row that cannot take tree rounds (its drafter "
                                 f"has no propose_tree, or the model has DeltaNet layers or tensor parallelism)")
            if not callable(getattr(self.draft_policy, "observe_tree", None)):
                raise ValueError(f"chose the token tree {out!r} but has no observe_tree")
            if not 1 <= len(out) <= budget or any(not isinstance(b, int) or not 1 <= b <= MAX_BRANCHING
                                                   for b in out) or tree_nodes(out) > MAX_TREE_NODES:
                raise ValueError(f"chose the token tree {out!r}, need 1..{budget} depths of 1..{MAX_BRANCHING} "
                                 f"nodes, at most {MAX_TREE_NODES} in all")
        elif not isinstance(out, int) or isinstance(out, bool) or not 0 <= out <= budget:
            raise ValueError(f"chose {out!r} drafts, need an int in 0..{budget} or a token-tree shape")

    def _linear_proposal(self, seqs: list[Sequence], n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafter's ``n`` drafts per row, checked: int64 ``[B, n]`` ids in the vocabulary (ValueError else)."""
        assert self.drafter is not None and n >= 1
        drafts, draft_probs = self.drafter.propose(seqs, n)
        if not isinstance(drafts, torch.Tensor) or tuple(drafts.shape) != (len(seqs), n) or \
                drafts.dtype != torch.int64:
            got = f"{drafts.dtype} {list(drafts.shape)}" if isinstance(drafts, torch.Tensor) else repr(drafts)
            raise ValueError(f"the drafter proposed {got}, need int64 [{len(seqs)}, {n}]")
        self._check_vocab(drafts)
        return drafts, draft_probs

    def _check_vocab(self, tokens: torch.Tensor) -> None:
        """ValueError unless every id of ``tokens`` lies in the model's whole vocabulary ``[0, V)``: the logits'
        width, which under tensor parallelism spans every rank's partition (``transformer.config`` holds this
        rank's partition alone, ``sharding.local_config``)."""
        vocab = self.transformer.vocab_size
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
            raise ValueError(f"the drafter proposed token ids outside the vocabulary [0, {vocab}): "
                             f"{tokens.tolist()}")

    def _verify(self, seqs: list[Sequence], n: int, drafts: torch.Tensor,
                draft_probs: torch.Tensor | None) -> list[AcceptResult]:
        """Verify ``drafts`` ``[B, n]`` in one forward, accept per row, seal the accepted KV, append the tokens."""
        assert self.drafter is not None
        drafts = drafts.to(self.pool.device)
        draft_probs = None if draft_probs is None else draft_probs.to(self.pool.device)
        self._activate(seqs)
        last = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.int64, device=self.pool.device)
        start = np.array([s.last_pos for s in seqs], dtype=np.int64)
        graphs = self.verify_graphs
        out = self._forward(torch.cat([last, drafts], dim=1), start, graphs,
                            graphs is not None and graphs.eligible(len(seqs)), keep_states=True)
        results = [self._accept(seq, drafts[b], None if draft_probs is None else draft_probs[b], out.logits[b])
                   for b, seq in enumerate(seqs)]
        kept = np.array([r.num_accepted for r in results], dtype=np.int64)
        self.pool.truncate_to(start + 1 + kept, start + n + 1)  # KV of the window's kept positions stays
        self.transformer.rewind(out, kept)  # a hybrid model: each row's DeltaNet state after its last kept position
        drafted = drafts.tolist()
        for b, (seq, res) in enumerate(zip(seqs, results)):
            kept_rows = slice(0, res.num_tokens)  # the window's kept positions: the last token and the kept drafts
            self._append_round(seq, RoundRecord(int(start[b]), n, tuple(drafted[b]), res.num_accepted, res.tokens),
                               n, out.hidden[b, kept_rows], out.logits[b, kept_rows])
        return results

    def _append_round(self, seq: Sequence, record: RoundRecord, proposed: int, hidden: torch.Tensor,
                      logits: torch.Tensor) -> None:
        """Book one verified round of ``seq`` (counters, its ``on_round`` hook), give the drafter the true hidden
        rows of the kept positions (``hidden`` ``[kept + 1, D]``) and append the round's tokens, each with the raw
        log-distribution of its position (``logits`` ``[kept + 1, V]``) when the request wants logprobs."""
        seq.forwards += 1
        seq.rounds += 1
        seq.proposed += proposed
        seq.accepted += record.num_accepted
        seq.accept_lengths[len(record.tokens)] += 1
        seq.on_round(record)
        self.drafter_call([seq], "commit", seq, hidden)
        logp = torch.log_softmax(logits.float(), dim=-1) if seq.logprobs is not None else None
        for j, token in enumerate(record.tokens):
            if seq.push(token, None if logp is None else logp[j]):
                break

    # ------------------------------------------------------------------ token-tree round
    def _tree_proposal(self, seqs: list[Sequence], branching: tuple[int, ...]) -> DraftTree:
        """The drafter's token trees, checked: a ``DraftTree`` of 1 .. ``tree_nodes(branching)`` nodes per row (a
        drafter may propose a smaller tree than the shape allows: a dynamic shape) of at most ``len(branching)``
        depths, ids in the vocabulary (ValueError else)."""
        assert self.drafter is not None
        tree = getattr(self.drafter, "propose_tree")(seqs, branching)
        if not isinstance(tree, DraftTree) or tree.tokens.shape[0] != len(seqs) or \
                not 1 <= tree.size <= tree_nodes(branching) or int(tree.depths().max()) > len(branching):
            raise ValueError(f"the drafter proposed {tree!r} for {len(seqs)} rows, need a DraftTree of 1.."
                             f"{tree_nodes(branching)} nodes per row and at most {len(branching)} depths")
        self._check_vocab(tree.tokens)
        return tree

    def _verify_tree(self, seqs: list[Sequence], branching: tuple[int, ...], tree: DraftTree) -> list[TreeAccept]:
        """Verify ``tree`` in one forward with the tree mask, accept the longest path the target follows
        (``draft_tree.accept_tree``), move the accepted nodes' KV to consecutive positions, seal the rest
        (``truncate_to``) and append the tokens."""
        assert self.drafter is not None
        tokens = tree.tokens.to(self.pool.device)
        m = tree.size
        self._activate(seqs)
        last = torch.tensor([[s.tokens[-1]] for s in seqs], dtype=torch.int64, device=self.pool.device)
        start = np.array([s.last_pos for s in seqs], dtype=np.int64)
        out = self.transformer(torch.cat([last, tokens], dim=1), start, self.pool, self.backend,
                               offsets=tree.depths(), mask=window_mask(tree, start))
        depths = tree.depths()
        results = [self._accept_tree(seq, tree, b, depths[b], out.logits[b]) for b, seq in enumerate(seqs)]
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
            record = RoundRecord(int(start[b]), own, tuple(drafted[b][:own]), res.num_accepted, res.tokens,
                                 tuple(int(p) for p in tree.parents[b, :own]))
            self._append_round(seq, record, len(branching), out.hidden[b, path], out.logits[b, path])
        return results

    @staticmethod
    def _accept_tree(seq: Sequence, tree: DraftTree, row: int, depths: np.ndarray,
                     logits: torch.Tensor) -> TreeAccept:
        """The target's choice after every node (its processors applied as if the node's path were accepted; at
        temperature > 0 the draw with the uniform of the position the choice fills, as plain decoding draws), then
        the walk of ``accept_tree``."""
        logits = seq.processed(logits, tree.paths(row))
        if seq.temperature == 0:
            targets = logits.argmax(dim=-1).tolist()
        else:
            first = seq.last_pos + 1  # the node at depth d predicts the token at first + d
            uniforms = [seq.rng.uniform(first + int(d)) for d in depths]
            targets = sample(logits, seq.temperature, seq.top_p, uniforms, top_k=seq.top_k,
                             min_p=seq.min_p).tolist()
        return accept_tree(tree.children(row), lambda slot: targets[slot])

    @staticmethod
    def _accept(seq: Sequence, drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                logits: torch.Tensor) -> AcceptResult:
        """Greedy drafts: compare with the target's samples at every window position (``accept_greedy``);
        sampled drafts: rejection sampling against the target's distributions."""
        d = drafts.tolist()
        first = seq.last_pos + 1  # window position j predicts the token at first + j
        # the request's processors at every window position, as if the drafts before it were accepted
        logits = seq.processed(logits, [d[:j] for j in range(len(d) + 1)])
        if seq.temperature > 0 and seq.draft_sampling == "sample" and draft_probs is not None:
            p = probabilities(logits, seq.temperature, seq.top_p, seq.top_k, seq.min_p)
            return accept_rejection(d, draft_probs, p, seq.rng.at(first, seq.rng.ACCEPT))
        if seq.temperature == 0:
            return accept_greedy(d, logits.argmax(dim=-1).tolist())
        uniforms = [seq.rng.uniform(first + j) for j in range(len(d) + 1)]  # the draws plain decoding would make
        targets = sample(logits, seq.temperature, seq.top_p, uniforms, top_k=seq.top_k, min_p=seq.min_p)
        return accept_greedy(d, targets.tolist())
