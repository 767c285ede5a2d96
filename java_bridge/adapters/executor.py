"""``smile.llm.python.PythonModelExecutor``: Smile's ``ModelExecutor`` of the bridged model.

Java's ``InferenceEngine`` recognises it and serves its requests on the model's Python serving loop
(``attachEngine``). Smile code may also drive the model step by step through the step API: ``bind``
a request into the model's pool (prefix reuse included), ``prefill``/``prefillChunk`` its prompt,
``decodeStep`` batches of rows (one token each), then ``finish`` or ``evict`` it. Each forward is
the one ``ModelRunner`` runs (the transformer over the pool and the model's attention backend,
eager, no drafting); logits come back as host float32 ``smile.deep.tensor.Tensor``s.

Threads: every step call that touches the pool runs between two steps of the model's serving loop
(``ServingLoop.run_between_steps``), so Java step calls and Python ``generate``/``submit`` callers
share the model safely. Requests bound here are the executor's: the serving loop never sees them,
and the executor refuses ids it did not bind. A forward that fails evicts the requests it ran (their
KV is not trusted; ``evict`` of them is then a no-op).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
from jpype import JArray, JClass, JFloat, JImplements

from smile_llm.serving.model_runner import PREFILL_CHUNK

from ..errors import bridged
from .convert import checked_int, int_array
from .engine import ModelAdapter, ServingEngineAdapter

T = TypeVar("T")

# the longest a step call waits for the serving loop's current step to end
STEP_LOCK_TIMEOUT_S = 300.0


@dataclass
class _Bound:
    """A request bound by the executor: the ``tokens`` whose KV it may write (its prompt, then
    each token fed to ``decodeStep``) and the ``capacity`` asked of ``bind``."""

    prompt: np.ndarray
    tokens: list[int]
    capacity: int


def host_tensor(logits: torch.Tensor) -> Any:
    """``logits`` ``[rows, vocab]`` as a host float32 ``smile.deep.tensor.Tensor``."""
    data = logits.detach().float().cpu().contiguous().numpy()
    rows, vocab = data.shape
    return JClass("smile.deep.tensor.Tensor").of(JArray(JFloat)(data.ravel()), rows, vocab)


@JImplements("smile.llm.python.PythonModelExecutor", deferred=True)
@bridged
class ModelExecutorAdapter:
    """The executor of ``model_adapter`` (a ``LanguageModelAdapter``)."""

    def __init__(self, model_adapter: ModelAdapter) -> None:
        self._model_adapter = model_adapter
        self._model = model_adapter.model
        # requests bound by bind() and not yet finished or evicted (changed between steps only)
        self._bound: dict[int, _Bound] = {}

    def model(self) -> Any:
        """Java ``model()``: the model's adapter."""
        return self._model_adapter

    def kvCachePool(self) -> Any:  # noqa: N802
        """Java ``kvCachePool()``: the model's pool."""
        return self._model_adapter.kvCachePool()  # type: ignore[attr-defined]

    def padToken(self) -> int:  # noqa: N802
        """Java ``padToken()``: the checkpoint's pad id, else its first end-of-sequence id, else
        0."""
        pad = getattr(self._model.config, "pad_token_id", None)
        eos = tuple(self._model.config.eos_token_ids)
        return checked_int(pad if pad is not None else eos[0] if eos else 0, "padToken")

    def stopTokens(self) -> np.ndarray:  # noqa: N802
        """Java ``int[] stopTokens()``: the end-of-sequence ids."""
        return np.asarray(list(self._model.config.eos_token_ids), dtype=np.int32)

    def decode(self, tokens: Any) -> str:
        """Java ``decode(int[] tokens)``."""
        return self._model.decode(int_array(tokens).tolist())

    def tryDecode(self, tokens: Any, skip_special: Any) -> str:  # noqa: N802
        """Java ``tryDecode(int[] tokens, boolean skipSpecial)``: the text, or
        ``CharacterCodingException`` when it ends inside a UTF-8 character."""
        text = self._model.decode(int_array(tokens).tolist())
        if text.endswith("\ufffd"):
            raise JClass("java.nio.charset.CharacterCodingException")()
        return text

    def supportsStepApi(self) -> bool:  # noqa: N802
        """Java ``supportsStepApi()``: true."""
        return True

    def maxSeqLen(self) -> int:  # noqa: N802
        """Java ``maxSeqLen()``."""
        return checked_int(self._model.max_seq_len, "maxSeqLen")

    def attachEngine(self, max_in_flight: Any, prefill_token_budget: Any) -> Any:  # noqa: N802
        """Java ``attachEngine(int maxInFlight, int prefillTokenBudget)``."""
        return ServingEngineAdapter.attach(self._model_adapter, max_in_flight,
                                           prefill_token_budget)

    # ------------------------------------------------------------------ the step API

    def bind(self, prompt: Any, total_capacity: Any) -> int:
        """Java ``int bind(int[] prompt, int totalCapacity)``: ``pool.bind_request`` (a cached
        prefix of the prompt is reused, see ``prefixLen``). IllegalArgumentException for a null or
        empty prompt, an id outside the vocabulary, or a ``totalCapacity`` below the prompt's
        length or above ``maxSeqLen``; ``KvCacheExhaustedException`` when the pool has no room
        now (nothing bound)."""
        ids = self._tokens(prompt, "prompt")
        if not len(ids):
            raise ValueError("prompt must not be empty")
        capacity = int(total_capacity)
        if capacity < len(ids):
            raise ValueError(f"totalCapacity {capacity} is less than the prompt's {len(ids)} "
                             "tokens")
        if capacity > self._model.max_seq_len:
            raise ValueError(f"totalCapacity {capacity} is more than maxSeqLen "
                             f"{self._model.max_seq_len}")
        pool = self._model.pool

        def bind_now() -> int:
            rid = pool.bind_request(ids, capacity)
            try:
                rid = checked_int(rid, "bind")
            except BaseException:
                pool.unbind_request(rid)
                raise
            self._bound[rid] = _Bound(ids, ids.tolist(), capacity)
            return rid

        return self._between_steps(bind_now)

    def prefixLen(self, request_id: Any) -> int:  # noqa: N802
        """Java ``int prefixLen(int requestId)``: ``pool.matched_prefix_len``, the prompt tokens
        served from the prefix cache (a multiple of the page size, never the last prompt token).
        IllegalArgumentException for an id this executor did not bind."""
        rid = self._request(request_id, "requestId")
        return checked_int(self._model.pool.matched_prefix_len(rid), "prefixLen")

    def prefill(self, request_id: Any, prompt: Any, prefix_len: Any) -> Any:
        """Java ``Tensor prefill(int requestId, int[] prompt, int prefixLen)``: the forward over
        ``prompt[prefixLen, length)``; the logits of the last position, ``[1, vocab]``.
        ``prompt`` must be the bound one and ``prefixLen`` the request's written length (its
        ``prefixLen()`` right after ``bind``); IllegalArgumentException otherwise."""
        return self._prefill(request_id, prompt, prefix_len, None, "prefixLen")

    def prefillChunk(self, request_id: Any, prompt: Any, start: Any, end: Any) -> Any:  # noqa: N802
        """Java ``Tensor prefillChunk(int requestId, int[] prompt, int from, int to)``: the forward
        over ``prompt[from, to)``; the logits of the last position (``[1, vocab]``) when ``to`` is
        the prompt's length, otherwise null. ``from`` must be the request's written length (its
        ``prefixLen()``, then the previous chunk's ``to``) and ``from < to <= length``;
        IllegalArgumentException otherwise."""
        return self._prefill(request_id, prompt, start, end, "from")

    def decodeStep(self, request_ids: Any, last_tokens: Any, positions: Any) -> Any:  # noqa: N802
        """Java ``Tensor decodeStep(int[] requestIds, int[] lastTokens, int[] positions)``: one
        forward of row ``i``'s ``lastTokens[i]`` at ``positions[i]`` of request ``requestIds[i]``,
        the rows together; the next-token logits ``[rows, vocab]``. Each request must have
        prefilled its prompt, and its position is its written length (the prompt's length plus the
        tokens decoded before, i.e. where the last token goes), below its ``totalCapacity``.
        IllegalArgumentException, naming the argument and row, for anything else (null or empty
        arrays, lengths that differ, a repeated or unknown id, a token outside the vocabulary)."""
        rids = self._ints(request_ids, "requestIds")
        tokens = self._tokens(last_tokens, "lastTokens")
        pos = self._ints(positions, "positions")
        if not len(rids):
            raise ValueError("requestIds must not be empty")
        for name, arr in (("lastTokens", tokens), ("positions", pos)):
            if len(arr) != len(rids):
                raise ValueError(f"{name} has {len(arr)} entries but requestIds has {len(rids)}: "
                                 "give one per row")
        seen: dict[int, int] = {}
        for i, rid in enumerate(rids.tolist()):
            if rid in seen:
                raise ValueError(f"requestIds[{i}] = {rid} repeats requestIds[{seen[rid]}]: list "
                                 "each request once")
            seen[rid] = i
        rows = [self._request(rid, f"requestIds[{i}]") for i, rid in enumerate(rids.tolist())]
        pool, transformer = self._model.pool, self._model.transformer

        def decode_now() -> Any:
            for i, rid in enumerate(rows):
                b = self._bound_or_refuse(rid, f"requestIds[{i}]")
                written = pool.kv_len(rid)
                if written < len(b.prompt):
                    raise ValueError(f"requestIds[{i}] = {rid} has written {written} of its "
                                     f"{len(b.prompt)} prompt positions: prefill it first")
                if int(pos[i]) != written:
                    raise ValueError(f"positions[{i}] = {int(pos[i])} must be request {rid}'s "
                                     f"written length {written} (where its last token goes)")
                if written >= b.capacity:
                    raise ValueError(f"positions[{i}] = {written} is past request {rid}'s "
                                     f"totalCapacity {b.capacity}")
            with self._evict_on_error(rows):
                pool.activate_step(*rows)
                x = torch.tensor(tokens.reshape(-1, 1), dtype=torch.int64, device=pool.device)
                out = transformer(x, pos.astype(np.int64), pool, self._model.backend)
                logits = host_tensor(out.logits[:, -1])
            for rid, token in zip(rows, tokens.tolist()):
                self._bound[rid].tokens.append(token)
            return logits

        return self._between_steps(decode_now)

    def finish(self, request_id: Any, sequence_tokens: Any) -> None:
        """Java ``finish(int requestId, int[] sequenceTokens)``: ``pool.finish_request`` (the
        written, page-aligned prefix of the sequence enters the prefix cache, then the request's KV
        is released; null: released, nothing cached). IllegalArgumentException for an id this
        executor does not hold, or a sequence that does not start with the tokens the request
        wrote (its prompt, then the ``lastTokens`` it decoded); nothing changes then."""
        rid = self._request(request_id, "requestId")
        seq = None if sequence_tokens is None else self._ints(sequence_tokens, "sequenceTokens")
        pool = self._model.pool

        def finish_now() -> None:
            b = self._bound_or_refuse(rid, "requestId")
            if seq is not None:
                written = min(len(seq), pool.kv_len(rid))
                differ = np.flatnonzero(seq[:written] != np.asarray(b.tokens[:written]))
                if len(differ):
                    raise ValueError(f"sequenceTokens must start with the tokens request {rid} "
                                     "wrote (its prompt, then the lastTokens it decoded); they "
                                     f"differ at index {int(differ[0])}")
            pool.finish_request(rid, seq)
            del self._bound[rid]

        self._between_steps(finish_now)

    def evict(self, request_id: Any) -> None:
        """Java ``evict(int requestId)``: ``pool.unbind_request``, the request's KV released,
        nothing cached. An id this executor does not hold (already finished or evicted, or evicted
        by a failed forward) does nothing."""
        rid = int(request_id)
        pool = self._model.pool

        def evict_now() -> None:
            if self._bound.pop(rid, None) is not None:
                pool.unbind_request(rid)

        self._between_steps(evict_now)

    # ------------------------------------------------------------------ helpers

    def _between_steps(self, fn: Callable[[], T]) -> T:
        """``fn`` between two steps of the model's serving loop (IllegalStateException when its
        current step does not end within STEP_LOCK_TIMEOUT_S, or from inside a step)."""
        loop = self._model.serving_loop
        try:
            return loop.run_between_steps(fn, STEP_LOCK_TIMEOUT_S)
        except TimeoutError as exc:
            raise RuntimeError(str(exc)) from exc

    def _request(self, request_id: Any, what: str) -> int:
        rid = int(request_id)
        self._bound_or_refuse(rid, what)
        return rid

    def _bound_or_refuse(self, rid: int, what: str) -> _Bound:
        b = self._bound.get(rid)
        if b is None:
            raise ValueError(f"{what} = {rid} is not a request bound by this executor (bind one; "
                             "finish and evict end it)")
        return b

    @staticmethod
    def _ints(values: Any, what: str) -> np.ndarray:
        if values is None:
            raise ValueError(f"{what} must not be null")
        return int_array(values)

    def _tokens(self, values: Any, what: str) -> np.ndarray:
        ids = self._ints(values, what)
        vocab = int(self._model.config.vocab_size)
        bad = np.flatnonzero((ids < 0) | (ids >= vocab))
        if len(bad):
            raise ValueError(f"{what}[{int(bad[0])}] = {int(ids[bad[0]])} is outside the "
                             f"vocabulary [0, {vocab})")
        return ids

    def _prefill(self, request_id: Any, prompt: Any, start: Any, end: Any,
                 start_name: str) -> Any:
        rid = self._request(request_id, "requestId")
        ids = self._ints(prompt, "prompt")
        first = int(start)
        stop = len(ids) if end is None else int(end)
        pool, transformer = self._model.pool, self._model.transformer

        def prefill_now() -> Any:
            b = self._bound_or_refuse(rid, "requestId")
            if not np.array_equal(ids, b.prompt):
                raise ValueError(f"prompt must be the prompt bound to request {rid} "
                                 f"({len(b.prompt)} tokens)")
            written = pool.kv_len(rid)
            if first != written:
                raise ValueError(f"{start_name} must be request {rid}'s written length {written} "
                                 f"(its prefixLen after bind, then the end of the last chunk), "
                                 f"got {first}")
            if first >= len(ids):
                raise ValueError(f"{start_name} {first} leaves nothing of the {len(ids)}-token "
                                 "prompt to prefill")
            if not first < stop <= len(ids):
                raise ValueError(f"to must be in ({first}, {len(ids)}], got {stop}")
            with self._evict_on_error([rid]):
                for a in range(first, stop, PREFILL_CHUNK):
                    z = min(stop, a + PREFILL_CHUNK)
                    pool.activate_step(rid)
                    x = torch.tensor(ids[None, a:z], dtype=torch.int64, device=pool.device)
                    out = transformer(x, np.array([a], dtype=np.int64), pool,
                                      self._model.backend,
                                      logit_cols=np.array([z - a - 1], dtype=np.int64))
                return host_tensor(out.logits[:, -1]) if stop == len(ids) else None

        return self._between_steps(prefill_now)

    @contextmanager
    def _evict_on_error(self, rids: list[int]) -> Iterator[None]:
        """Evict ``rids`` when the block fails (a forward's KV is not trusted then)."""
        try:
            yield
        except BaseException:
            for rid in rids:
                if self._bound.pop(rid, None) is not None:
                    try:
                        self._model.pool.unbind_request(rid)
                    except Exception:  # noqa: BLE001, S110 - the forward's error is the one raised
                        pass
            raise
