"""ServingContext: what the serving layer needs of one loaded model, handed down by the facade
(never the facade itself): the model runner (with its pool, drafter and draft policy), the
tokenizer, the vocabulary, the stop ids, the longest request and whether rounds may be token trees.
``ServingContext.request`` (the one validation), ``RequestRow``, the ``Scheduler`` and the
``ServingLoop`` read it; nothing below the facade calls back up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..cache import KvCachePool
from ..cache.tokens import as_int_array
from ..models.checkpoint.config import MAX_SPECULATIVE_TOKENS
from ..text.tokenizer import Tokenizer
from ..sampling.grammar_compiler import GrammarCompiler
from ..speculative.drafters import Drafter
from ..errors import PromptTooLongError, RequestError, RequestTypeError, SegmentError
from .model_runner import ModelRunner
from .request_row import RequestRow
from .request import AUTO, Request, RequestHandle, SamplingParams, as_listener, check_prompt
from .segments import SegmentLayout, Splice, pad_token


@dataclass(frozen=True)
class ServingContext:
    """One model's serving parts. ``tree_rounds``: speculative rounds may be token trees (the
    drafter proposes them and the model verifies them: a dense model on one rank)."""

    runner: ModelRunner
    tokenizer: Tokenizer
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_seq_len: int  # the longest prompt plus completion of one request
    tree_rounds: bool
    grammars: GrammarCompiler  # the model's compiled output constraints

    @property
    def pool(self) -> KvCachePool:
        """The main KV pool (every request is bound here)."""
        return self.runner.pool

    @property
    def device(self) -> torch.device:
        return self.runner.pool.device

    @property
    def drafter(self) -> Drafter | None:
        """The model's drafter (None: plain decoding only)."""
        return self.runner.drafter

    def row(self, handle: RequestHandle, request_id: int, matched: int,
            capacity: int) -> RequestRow:
        """The scheduler's row for ``handle``'s request, bound in the pool as ``request_id`` with
        ``matched`` prompt positions from the prefix cache and ``capacity`` positions bound."""
        return RequestRow(handle, request_id, matched, capacity,
                          tokenizer=self.tokenizer, device=self.device,
                          eos_token_ids=self.eos_token_ids, tree_rounds=self.tree_rounds)

    def token_ids(self, values: object, name: str) -> list[int]:
        """``values`` as token ids; ``RequestError`` (field ``name``) naming the first id outside
        [0, vocab_size), whatever the id (negative, just past the end, or huge), or for anything but
        a 1-D int sequence."""
        try:
            arr = as_int_array(values, name, non_negative=False)
        except ValueError as exc:  # the pool's own check, shared with its callers: here a request's
            raise RequestError(str(exc), field=name) from None
        bad = (arr < 0) | (arr >= self.vocab_size)
        if bad.any():
            raise RequestError(f"token {int(arr[bad.argmax()])} is outside the vocabulary "
                               f"[0, {self.vocab_size})", field=name)
        return arr.tolist()

    def encode(self, prompt: str | Sequence[int], name: str = "prompt") -> list[int]:
        """Token ids of ``prompt`` (text through the tokenizer, or ids checked against the
        vocabulary). ``RequestError`` (field ``name``) for an empty prompt, text that is not valid
        Unicode (a lone surrogate) or an id outside the vocabulary."""
        if isinstance(prompt, str):
            try:
                values: object = self.tokenizer.encode(prompt)
            except UnicodeError as exc:
                raise RequestError(f"{name} is not valid Unicode text: {exc}", field=name) from None
        else:
            values = prompt
        ids = self.token_ids(values, name)
        if not ids:
            raise RequestError(f"the {name} is empty; give at least one token", field=name)
        return ids

    def segment_tokens(self, segment: str | Sequence[int]) -> list[int]:
        """The ids of a segment to register (``encode``): ``RequestError`` (field ``segment``) for
        an empty one or one that leaves no room for a prompt token after it within
        ``max_seq_len``; RequestTypeError for a value that is no prompt (``check_prompt``)."""
        check_prompt(segment, "segment")
        ids = self.encode(segment, "segment")
        if len(ids) >= self.max_seq_len:
            raise RequestError(f"segment of {len(ids)} tokens leaves no room for a prompt token "
                               f"within max_seq_len {self.max_seq_len}; shorten it",
                               field="segment")
        return ids

    def speculative_tokens_for(self, requested: int | None) -> int:
        """Drafts per round for a request: 0 without a drafter or for ``requested == 0``; None means
        the drafter's default (``drafter.num_speculative_tokens``); at most MAX_SPECULATIVE_TOKENS.
        ValueError for non-ints."""
        if requested is not None and (isinstance(requested, bool) or
                                      not isinstance(requested, int) or requested < 0):
            raise RequestError(f"speculative_tokens must be None or an int >= 0, got {requested!r}",
                               field="speculative_tokens")
        drafter = self.drafter
        if requested == 0 or drafter is None:
            return 0
        return min(requested or drafter.num_speculative_tokens, MAX_SPECULATIVE_TOKENS)

    def request(self, prompt: Any, params: SamplingParams | None = None, *, listener: Any = None,
                cancel: Any = None, on_round: Any = None,
                listeners: Sequence[Any] | None = None) -> Request:
        """Validate and resolve one request for this model: the one place where a prompt and its
        parameters become a ``Request``, before anything is bound. ``RequestError`` (or
        ``RequestTypeError``) with the field in ``field``: an empty prompt or a token outside the
        vocabulary (``prompt``), a prompt longer than ``max_seq_len`` (``PromptTooLongError``), a
        stop id outside the vocabulary (``stop``), ``params`` not a SamplingParams,
        ``cancel``/``on_round`` not callable, a ``listener`` with ``n > 1`` (``listeners``: one per
        sample, ``params.n`` of them, instead of ``listener``), a prompt that is neither a str nor a
        sequence of token ids (``check_prompt``), a listener that is neither a GenerationListener
        nor a callable (``as_listener``: a plain callable receives the text chunks), and a
        constraint the grammar engine refuses (ConstraintError naming its field, compiled here
        through the model's ``grammars``)."""
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise RequestTypeError(f"params must be a SamplingParams, got {type(params).__name__} "
                                   "(build one with SamplingParams(max_new_tokens=..., ...))",
                                   field="params")
        for name, hook in (("cancel", cancel), ("on_round", on_round)):
            if hook is not None and not callable(hook):
                raise RequestTypeError(f"{name} must be None or a callable, got {hook!r}",
                                       field=name)
        listener = as_listener(listener)
        per_sample: tuple[Any, ...] = ()
        if listeners is not None:
            if listener is not None or len(listeners) != params.n:
                raise RequestError(f"listeners: give one per sample ({params.n}), instead of "
                                   f"listener; got {len(listeners)}", field="listeners")
            per_sample = tuple(as_listener(x) for x in listeners)
        if listener is not None and params.n > 1:
            raise RequestError(f"listener: a request for n={params.n} samples returns them "
                               "together and takes no listener; listen to (or stream) one sample "
                               "at a time with n=1", field="listener")
        check_prompt(prompt)
        ids = self.encode(prompt)
        splices: tuple[Splice, ...] = ()
        if params.segments is not None:  # laid out before the prompt (segments.lay_out)
            layout = self.segment_layout(params)
            ids, splices = layout.tokens + ids, layout.splices
        if len(ids) > self.max_seq_len:
            raise PromptTooLongError(len(ids), self.max_seq_len)
        vocab = self.vocab_size
        stop_ids, stop_texts = set(self.eos_token_ids), []
        for entry in params.stop_entries():
            if isinstance(entry, str):
                if entry:
                    stop_texts.append(entry)
            elif entry >= vocab:
                raise RequestError(f"stop entries must be token ids in [0, {vocab}) or strings: "
                                   f"got token id {entry}, outside the vocabulary", field="stop")
            else:
                stop_ids.add(entry)
        if params.draft_tree is not None:
            drafter = self.drafter
            if drafter is None or not callable(getattr(drafter, "propose_tree", None)):
                raise RequestError(f"draft_tree: this model's drafter ({type(drafter).__name__}) "
                                   "does not propose token trees (the MTP, n-gram and draft-model "
                                   "drafters do); drop draft_tree or load another drafter",
                                   field="draft_tree")
            if not self.tree_rounds:
                raise RequestError("draft_tree: token trees need a dense model on one rank (no "
                                   "DeltaNet layers, no tensor parallelism)", field="draft_tree")
            if params.speculative_tokens is None:
                params = replace(params, speculative_tokens=len(params.draft_tree))
        outside = [t for t in (params.logit_bias or {}) if t >= vocab]
        if outside:
            raise RequestError(f"logit_bias keys must be token ids in [0, {vocab}): got token id "
                               f"{outside[0]}, outside the vocabulary", field="logit_bias")
        adaptive = params.speculative_tokens == AUTO
        requested = params.speculative_tokens
        drafts = self.speculative_tokens_for(MAX_SPECULATIVE_TOKENS if adaptive or
                                             isinstance(requested, str) else requested)
        constraint = params.constraint
        compiled = None if constraint is None else self.grammars.compile(constraint)
        return Request(ids, params, min(params.max_new_tokens, self.max_seq_len - len(ids)),
                       frozenset(stop_ids), tuple(stop_texts), drafts, listener, cancel, on_round,
                       adaptive and drafts > 0, compiled, splices, per_sample)

    def segment_layout(self, params: SamplingParams) -> SegmentLayout:
        """The prompt tokens and splices of ``params.segments`` (``SegmentRegistry.lay_out``: each
        segment at the next page boundary, padded with ``segments.pad_token``). SegmentError for a
        segment this model cannot use or for ``prompt_logprobs`` (a spliced position has no
        logits); SegmentUnsupportedError for a model that cannot splice."""
        if params.prompt_logprobs is not None:
            raise SegmentError("prompt_logprobs: a request with segments computes no logits at the "
                               "positions it splices; drop one of the two", field="prompt_logprobs")
        pad = pad_token(self.tokenizer.encode, self.eos_token_ids)
        return self.runner.segments.lay_out(params.segments or (), self.tokenizer.encode,
                                            self.token_ids, pad)
