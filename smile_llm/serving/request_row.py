"""RequestRow: the state of one request being generated (the scheduler's row), and its result,
``Completion``.

It holds the prompt and the tokens so far, sampling settings and generator, stop detection (ids and
strings), streaming to a listener, logprobs, the drafter's per-request state, and the counters that
become ``Completion.stats``. The caller's hooks never break the serving loop: an exception from the
listener (or the round callback) is recorded in ``error``, the row finishes, and the scheduler
fails that request alone.
Positions: the prompt occupies ``[0, P)``, generated token i sits at ``P + i``; the last token's KV
is written by the next forward, so the main pool holds KV for ``[0, last_pos)``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..errors import GrammarError
from ..sampling.grammar_state import GrammarState
from ..sampling.processors import TokenHistory, apply_rows
from ..sampling.token_mask import mask_logits
from ..sampling.next_tokens import choose_next
from .completion import Completion
from ..speculative.draft_tree import MAX_TREE_NODES, tree_nodes
from ..sampling.sampler import PositionalRng, logprob_entries, top_logprobs
from ..text.tokenizer import StreamDecoder, Tokenizer
from ..speculative.acceptance import RoundRecord
from ..cache.offload import OffloadedKv

if TYPE_CHECKING:
    from .request import RequestHandle

MAX_FORCED_TOKENS = 16  # tokens one jump-forward window appends at most


class RequestRow:
    """One request: tokens, sampling, stops, streaming, logprobs, draft state and stats."""

    def __init__(self, handle: RequestHandle, request_id: int, matched: int, capacity: int, *,
                 tokenizer: Tokenizer, device: torch.device, eos_token_ids: tuple[int, ...],
                 tree_rounds: bool) -> None:
        """``handle``'s request (the caller's view of it) bound as ``request_id`` with ``matched``
        prompt positions found in the prefix cache and ``capacity`` positions bound; the model's
        ``tokenizer`` (streamed text), ``device`` (the sampling generator's), ``eos_token_ids``
        (what ``min_new_tokens`` suppresses) and whether its rounds may be token trees
        (``ServingContext.tree_rounds``)."""
        request = handle.request
        p = request.params
        self.handle, self.request = handle, request
        # admission number in the scheduler (preemption takes the most recent first)
        self.admitted = 0
        # the private KV while the scheduler has it preempted
        self.offload: OffloadedKv | None = None
        self.prompt, self.matched = request.prompt, matched
        self.max_new_tokens = request.max_new_tokens
        # the bound KV capacity: positions stay below it (grows as pages are added)
        self.capacity = capacity
        self.request_id = request_id
        self.temperature, self.top_p = float(p.temperature), float(p.top_p)
        self.top_k, self.min_p = int(p.top_k), float(p.min_p)
        self.processing = p.processing(eos_token_ids)  # applied before any choice of a token
        # the processors' token statistics, once a processor needs them
        self._history: TokenHistory | None = None
        # the draw for a position depends on (seed, position)
        self.rng = PositionalRng(p.seed, device)
        self.listener = request.listener
        self.stop_ids, self.stop_texts = request.stop_ids, request.stop_texts
        self.speculative_tokens, self.draft_sampling = request.speculative_tokens, p.draft_sampling
        # alternatives per depth of a token-tree round (None: linear drafts)
        self.draft_tree = p.draft_tree
        self.adaptive = request.adaptive  # the model's draft policy chooses each round's drafts
        self.tree_rounds = tree_rounds  # whether a round may be a token tree
        # the drafter's state for this request: set by its bind, cleared by its release
        self.history: Any = None
        self.tokens: list[int] = []
        self.logprobs: list[float] | None = [] if p.wants_logprobs else None
        self.top_k_logprobs = p.top_logprobs
        self.top_logprobs: list[dict[int, float]] | None = [] if p.top_logprobs else None
        self.prompt_k_logprobs = p.prompt_logprobs
        # one entry per prompt position (the first has nothing to condition on); filled by the
        # prefill
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            None if p.prompt_logprobs is None else [None])
        # what the caller's hooks raised; the request then fails alone
        self.error: BaseException | None = None
        self.finished = False
        self.finish_reason = "length"
        self.stream = StreamDecoder(tokenizer)
        self.text = ""  # text of the generated tokens, up to any stop string
        self.cut = False  # a stop string ended the text
        self.sent = 0  # characters of ``text`` already given to on_text
        self.logits: torch.Tensor | None = None  # [1, V]: the last forward's logits at last_pos - 1
        self.prefilled = matched  # prompt positions whose KV is written
        # segments still to splice (those a prefix hit covers are dropped), the first position a
        # shifted one wrote (the prefix tree caches only what precedes it), tokens spliced
        self.splices = [s for s in request.splices if s.end > matched]
        self.exact_len: int | None = None
        self.spliced_tokens = 0
        self.t0 = time.perf_counter()
        self.prefill_s = 0.0
        self.forwards = 0
        self.prefill_forwards = 0
        self.rounds = self.proposed = self.accepted = 0
        # rounds the drafter failed (raised or proposed something unusable): decoded plainly
        self.draft_errors = 0
        # a drafter hook raised for this row: it decodes plainly from then on
        self.drafter_failed = False
        # times the scheduler paused it to make room (its KV offloaded, then restored)
        self.preemptions = 0
        self.accept_lengths: Counter[int] = Counter()  # tokens per speculative round -> rounds
        # the output constraint's state (None: free text); dropped when the request ends
        compiled = request.compiled_grammar
        self.grammar_state: GrammarState | None = None if compiled is None else compiled.start()
        self.constrained = self.grammar_state is not None
        self.constraint_complete = False  # the output is a whole match of its grammar
        self.forced_tokens = 0  # tokens the grammar forced (jump-forward), appended unsampled
        if self.grammar_state is not None and self.grammar_state.terminated:  # only "" matches
            self.finish_reason, self.finished, self.constraint_complete = "stop", True, True

    # ------------------------------------------------------------------ the caller's hooks
    def notify(self, event: str, value: object) -> None:
        """Call ``listener.<event>(value)`` if the listener has it (see ``_call`` for errors)."""
        listener = self.listener
        self._call(getattr(listener, event, None) if listener is not None else None, value)

    def on_round(self, record: RoundRecord) -> None:
        """Give the request's ``on_round`` hook a speculative round's record (see ``_call`` for
        errors)."""
        self._call(self.request.on_round, record)

    def _call(self, hook: Callable[[Any], object] | None, value: object) -> None:
        """``hook(value)`` unless there is no hook or the request already failed. An exception is
        recorded in ``error`` and finishes the row (no further events); it never propagates
        into the step."""
        if hook is None or self.error is not None:
            return
        try:
            hook(value)
        except Exception as exc:  # the caller's code: fail this request alone
            self.fail(exc)

    def fail(self, error: BaseException) -> None:
        """Record the first error of this request and stop it producing tokens."""
        if self.error is None:
            self.error = error
        self.finished = True
        self.listener = None

    # ------------------------------------------------------------------ positions
    def tokens_between(self, start: int, end: int) -> list[int]:
        """Tokens at positions ``[start, end)``."""
        return (self.prompt[start:end] if end <= len(self.prompt)
                else (self.prompt + self.tokens)[start:end])

    @property
    def final_len(self) -> int:
        """Prompt plus every token it may generate: the capacity it grows to at most."""
        return len(self.prompt) + self.max_new_tokens

    @property
    def last_pos(self) -> int:
        """Position of the last token (the next forward writes its KV)."""
        return len(self.prompt) + len(self.tokens) - 1

    @property
    def remaining(self) -> int:
        """Tokens this row may still produce (0 once finished)."""
        if self.finished:
            return 0
        return max(0, self.max_new_tokens - len(self.tokens))

    def draft_budget(self) -> int:
        """Drafts the next round may propose: the window ``[last, d_0..d_{n-1}]`` fits the bound
        capacity and the window plus the bonus token fit what the request may still produce (whether
        the drafter can draft is its ``ready``)."""
        if not self.tokens:
            return 0
        return max(0, min(self.speculative_tokens, self.remaining - 1,
                          self.capacity - self.last_pos - 1))

    def tree_fits(self, tree: tuple[int, ...] | None = None) -> bool:
        """Whether the next round can be the token tree ``tree`` (a draft policy's shape, whose
        depth is within the draft budget) or, by default, this request's whole ``draft_tree`` (its
        full depth is the draft budget): and every node fits the bound capacity (otherwise the round
        drafts a chain)."""
        if tree is None:
            tree = self.draft_tree
            if tree is None or self.draft_budget() != len(tree):
                return False
        return (len(tree) <= self.draft_budget()
                and self.last_pos + 1 + tree_nodes(tree) <= self.capacity)

    def round_span(self) -> int:
        """Positions after ``last_pos`` the next round may write: the tree's nodes, or its drafts;
        for a row whose draft policy may choose a tree, the most nodes a tree may have; for a
        constrained row at least a jump-forward window (``MAX_FORCED_TOKENS``)."""
        depth = min(self.speculative_tokens, max(0, self.remaining - 1))
        if self.grammar_state is not None:  # a jump-forward window
            depth = max(depth, min(MAX_FORCED_TOKENS, max(0, self.remaining - 1)))
        if self.adaptive and self.tree_rounds and depth:
            return MAX_TREE_NODES
        if self.draft_tree is not None and depth == len(self.draft_tree):
            return tree_nodes(self.draft_tree)
        return depth

    # ------------------------------------------------------------------ tokens
    def take_next(self) -> bool:
        """Sample the next token from the last logits and append it; True when the row has
        finished."""
        assert self.logits is not None
        return self.push(*choose_next([self], self.logits)[0])

    def add_prompt_logprobs(self, logits: torch.Tensor, start: int) -> None:
        """Record the prompt logprobs that ``logits`` ``[C, V]`` (a prefill chunk's, column j at
        position ``start + j``) give: for each prompt token they predict, its logprob and the
        ``prompt_logprobs`` most likely alternatives (raw, before processors and temperature)."""
        assert self.prompt_logprobs is not None
        # the last prompt position predicts a new token
        count = min(logits.shape[0], len(self.prompt) - 1 - start)
        if count <= 0:
            return
        logp = torch.log_softmax(logits[:count].float(), dim=-1)
        targets = self.prompt[start + 1 : start + 1 + count]
        self.prompt_logprobs.extend(logprob_entries(logp, targets, self.prompt_k_logprobs or 0))

    def processed(self, logits: torch.Tensor, extra: list[list[int]]) -> torch.Tensor:
        """``logits`` ``[N, V]`` after the request's grammar mask and processors, row i having
        generated ``tokens`` then ``extra[i]`` (a verify window's drafts before it); the logits
        themselves when neither is on."""
        if self.grammar_state is not None:
            try:
                logits = mask_logits(logits, self.grammar_state.masks(extra))
            except GrammarError as exc:  # the engine's failure: this request alone
                self.fail(exc)
        if not self.processing.active:
            return logits
        seen = counts = None
        if self.processing.needs_history:
            seen, counts = self.token_history(logits.shape[-1], logits.device).rows(extra)
        return apply_rows([self.processing] * logits.shape[0], logits, seen, counts,
                          [len(self.tokens) + len(e) for e in extra])

    def token_history(self, vocab: int, device: torch.device) -> TokenHistory:
        """The processors' statistics of this request's tokens (built on first use, then kept up to
        date by ``push``)."""
        if self._history is None:
            self._history = TokenHistory(self.prompt, vocab, device)
            for t in self.tokens:
                self._history.push(t)
        return self._history

    def push(self, token: int, logp: torch.Tensor | None = None) -> bool:
        """Append ``token`` (stream it, check stops and ``max_new_tokens``); True when the row has
        finished. ``logp``: the raw log-distribution ``[V]`` it was chosen from, for the requested
        logprobs. A finished row takes no token (True)."""
        if self.finished:
            return True
        if token in self.stop_ids:
            self.finish_reason = "stop"
            return self._finish()
        self.tokens.append(token)
        if self._history is not None:
            self._history.push(token)
        if self.grammar_state is not None:
            try:
                self.grammar_state.advance(token)
            except GrammarError as exc:  # the engine's failure: this request alone
                self.fail(exc)
                return True
        self.notify("on_token", token)
        if self.logprobs is not None and logp is not None:
            self.logprobs.append(float(logp[token]))
            if self.top_logprobs is not None:
                self.top_logprobs.append(top_logprobs(logp, self.top_k_logprobs))
        self.notify("on_generated_tokens", 1)
        chunk = self.stream.push(token)
        self.text += chunk
        for s in self.stop_texts:
            # only where it can be new
            at = self.text.find(s, max(0, len(self.text) - len(chunk) - len(s) + 1))
            if at >= 0:
                self.text = self.text[:at]
                self.cut = True
                self.finish_reason = "stop"
                return self._finish()
        if self.grammar_state is not None and self.grammar_state.terminated:
            self.finish_reason = "stop"  # the grammar ended: nothing but EOS could follow
            return self._finish()
        self._flush(hold=max((len(s) - 1 for s in self.stop_texts), default=0))
        if self.remaining == 0:
            return self._finish()
        return False

    def _finish(self) -> bool:
        self.finished = True
        if self.grammar_state is not None:  # a stop string cut the text: no longer a whole match
            self.constraint_complete = self.grammar_state.complete and not self.cut
        self._flush()
        return True

    def release_grammar_state(self) -> None:
        """Drop the constraint's state (the request ended, however it ended)."""
        self.grammar_state = None

    def _flush(self, hold: int = 0) -> None:
        """Give ``on_text`` the new text, holding back the last ``hold`` characters (a stop string
        may start)."""
        end = max(self.sent, len(self.text) - hold)
        if end > self.sent:
            self.notify("on_text", self.text[self.sent : end])
            self.sent = end

    # ------------------------------------------------------------------ result
    def stats(self) -> dict[str, Any]:
        """The request's counters and timings: ``prompt_tokens``, ``cached_tokens``,
        ``generated_tokens``, ``forwards``, ``speculative_rounds``, ``preemptions``,
        ``proposed_drafts``, ``accepted_drafts``, ``draft_errors`` (rounds the drafter failed,
        decoded plainly instead), ``mean_accepted_length``, ``accept_length_histogram``,
        ``target_forwards_per_token`` (1.0 for plain decoding), ``prefill_s``, ``decode_s``,
        ``tokens_per_s``; for a constrained request also ``forced_tokens`` (appended by
        jump-forward, unsampled) and ``constraint_complete`` (whether the output is a whole match
        of its grammar: False when it ended at ``max_new_tokens``, or at a stop, before the grammar
        could); for a request with segments also ``spliced_tokens`` (prompt positions whose KV was
        spliced, not computed)."""
        elapsed = time.perf_counter() - self.t0
        decode_s = max(elapsed - self.prefill_s, 1e-9)
        n = len(self.tokens)
        return {
            "prompt_tokens": len(self.prompt),
            "cached_tokens": self.matched,
            "generated_tokens": n,
            "forwards": self.forwards,
            "speculative_rounds": self.rounds,
            "preemptions": self.preemptions,
            "proposed_drafts": self.proposed,
            "accepted_drafts": self.accepted,
            "draft_errors": self.draft_errors,
            "mean_accepted_length": (sum(k * v for k, v in self.accept_lengths.items())
                                     / self.rounds if self.rounds else 0.0),
            "accept_length_histogram": dict(sorted(self.accept_lengths.items())),
            # decode forwards per token after the first (which the prefill produces): 1.0 for plain
            # decoding
            "target_forwards_per_token": ((self.forwards - self.prefill_forwards) / (n - 1) if n > 1
                                          else 0.0),
            "prefill_s": self.prefill_s,
            "decode_s": decode_s,
            "tokens_per_s": max(n - 1, 0) / decode_s,
        } | ({"forced_tokens": self.forced_tokens, "constraint_complete": self.constraint_complete}
             if self.constrained else {}) | ({"spliced_tokens": self.spliced_tokens}
                                             if self.request.splices else {})

    def cacheable(self, tokens: list[int]) -> list[int]:
        """``tokens`` (the prompt, or the prompt and the generated tokens) cut before the first
        position a shifted segment's splice wrote: all the prefix tree may cache of this request,
        whose later KV never attended to what precedes that segment."""
        return tokens if self.exact_len is None else tokens[: self.exact_len]

    def completion(self) -> Completion:
        """Flush the held-back text to the listener and return the request's ``Completion`` (check
        ``error`` afterwards: the flush may fail the request)."""
        if not self.cut:
            self.text += self.stream.finish()
        self._flush()
        return Completion(self.text, list(self.prompt), list(self.tokens), self.finish_reason,
                          self.logprobs, self.stats(), self.top_logprobs, self.prompt_logprobs)
