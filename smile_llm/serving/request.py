"""What a caller asks for and what it holds while waiting: ``SamplingParams``, the validated
``Request`` and the future-like ``RequestHandle``.

Every caller (``generate``, ``generate_batch``, ``submit_samples`` for the HTTP server,
``InferenceEngine.submit``, the JVM) goes through ``ServingContext.request``, the one place where a
prompt and its parameters become a request: the prompt is encoded and checked against the
vocabulary, the stops are resolved, ``max_new_tokens`` is clamped to ``max_seq_len`` and the draft
count is resolved. A bad field raises ``RequestError`` (``RequestTypeError`` for a wrong type) with
the field in ``field``, before anything is bound. The argument checks the callers share live
here too: ``check_prompt`` (what a prompt may be), ``check_keywords`` (every accepted keyword named,
the closest suggested) and ``as_listener`` (a plain callable receives the text).
"""

from __future__ import annotations

import difflib
import math
import numbers
import threading
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..speculative.acceptance import RoundRecord
from ..speculative.draft_tree import MAX_BRANCHING, MAX_TREE_NODES
from ..errors import RequestError, RequestTypeError
from .listener import LISTENER_EVENTS, GenerationListener, TextCallback
from .segments import Splice, check_pieces
from ..sampling.constraint import Constraint, constraint_of
from ..sampling.processors import LogitsProcessing
from ..sampling.sampler import GREEDY_TEMPERATURE

if TYPE_CHECKING:
    from ..sampling.grammar_compiler import CompiledGrammar
    from .completion import Completion

MAX_SEED = (1 << 64) - 1
DRAFT_SAMPLING = ("greedy", "sample")
AUTO = "auto"  # ``speculative_tokens="auto"``: the model's draft policy chooses k per round
# top alternatives per token (``logprobs``, ``prompt_logprobs``), as OpenAI and vLLM allow
MAX_LOGPROBS = 20
MAX_SAMPLES = 128  # ``n``: samples of one prompt
MAX_TREE_DEPTH = 7  # ``draft_tree`` depths (the most drafts per round, MAX_SPECULATIVE_TOKENS)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


PROMPT_KINDS = "a str or a sequence of int token ids"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_prompt(prompt: Any, name: str = "prompt") -> None:
    """RequestTypeError naming ``name`` unless ``prompt`` is a str or a flat sequence of token ids:
    a list or tuple of ints, a 1-D integer numpy array or torch tensor, or another iterable of ints.
    Bytes, a lone int, None, a mapping or set, a nested list and an array of another rank are
    refused with what is accepted; the ids themselves (range, vocabulary, emptiness) are checked by
    ``LanguageModel.encode``."""
    if isinstance(prompt, str):
        return
    kind = type(prompt).__name__
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise RequestTypeError(f"{name} must be {PROMPT_KINDS}, got {kind} {_short(prompt)}: "
                               f"decode bytes to a str first (e.g. {name}.decode('utf-8'))",
                               field=name)
    shape = getattr(prompt, "shape", None)
    if shape is not None and isinstance(getattr(prompt, "ndim", None), int) and prompt.ndim != 1:
        raise RequestTypeError(f"{name} must be {PROMPT_KINDS}, got a {prompt.ndim}-D {kind} of "
                               f"shape {tuple(shape)}; give one 1-D sequence of ids per prompt",
                               field=name)
    if isinstance(prompt, (dict, set, frozenset)) or not isinstance(prompt, Iterable):
        hint = (f"; for a single token id give [{prompt!r}]" if isinstance(prompt, numbers.Integral)
                else "")
        raise RequestTypeError(f"{name} must be {PROMPT_KINDS}, got {kind} {_short(prompt)}{hint}",
                               field=name)
    if isinstance(prompt, (list, tuple)):
        for i, item in enumerate(prompt):
            if isinstance(item, bool) or not isinstance(item, numbers.Integral):
                hint = ("; a list of prompts goes to generate_batch"
                        if isinstance(item, (str, list, tuple)) else "")
                raise RequestTypeError(f"{name} must be {PROMPT_KINDS}; {name}[{i}] is "
                                       f"{type(item).__name__} {_short(item)}{hint}", field=name)


def check_keywords(given: Iterable[str], accepted: Seq[str], call: str) -> None:
    """RequestTypeError (a TypeError, as Python's own) for the first name in ``given`` that is not
    in ``accepted``: the message names it, suggests the closest accepted name (``difflib``) and
    lists every name ``call`` accepts."""
    for name in given:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ";"
            raise RequestTypeError(f"{call} got an unexpected keyword argument {name!r}{hint} "
                                   f"{call} accepts {', '.join(accepted)}", field=name)


def as_listener(listener: object) -> GenerationListener | None:
    """The listener a request calls: None; an object with any ``GenerationListener`` method
    (``LISTENER_EVENTS``), as it is; a plain callable (``print``, a lambda, a bound method), wrapped
    in a ``TextCallback`` so that it receives each text chunk (``on_text``). RequestTypeError naming
    ``listener`` for anything else, and for a listener class given instead of an instance."""
    if listener is None:
        return None
    if isinstance(listener, type):
        raise RequestTypeError("listener must be a GenerationListener instance or a callable "
                               f"taking each text chunk, got the class {listener.__name__}; pass "
                               f"{listener.__name__}()", field="listener")
    if any(callable(getattr(listener, event, None)) for event in LISTENER_EVENTS):
        return cast(GenerationListener, listener)  # any object with the methods it wants to hear
    if callable(listener):
        return TextCallback(listener)
    raise RequestTypeError("listener must be a GenerationListener (an object with any of "
                           f"{', '.join(LISTENER_EVENTS)}) or a callable taking each text chunk, "
                           f"got {type(listener).__name__} {_short(listener)}", field="listener")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request settings: greedy at ``temperature`` 0, nucleus sampling (``top_p``) otherwise (a
    temperature below ``GREEDY_TEMPERATURE``, 1e-5 as in vLLM, is greedy and stored as 0.0);
    ``seed`` 0 is nondeterministic, any other seed in [-2**63, 2**64) reproducible (a negative seed
    is read as the unsigned 64-bit value of the same bits, as a Java ``long``);
    ``speculative_tokens="auto"``: the model's draft policy (``LanguageModel.draft_policy``,
    ``draft_policy`` module) chooses the drafts of every round, up to 7; ``logprobs``: True (or 0)
    returns the chosen tokens' logprobs, an int k in [1, 20] also the k most likely alternatives per
    token (``Completion.top_logprobs``); ``prompt_logprobs``: None, or k in [0, 20] for each prompt
    token's logprob and its k alternatives (the request then computes its whole prompt, without
    prefix reuse); ``n`` in [1, 128] samples of the prompt (its KV computed once, shared through the
    prefix cache; sample i > 0 draws with a seed derived from ``seed`` and i); ``draft_tree``: a
    token tree of drafts per round, the number of alternatives at each depth (``draft_tree`` module:
    the drafter's chain plus its next most likely tokens as leaves; needs a drafter with
    ``propose_tree`` and a dense model on one rank); ``stop`` a token id, a string, or a list/tuple
    of those (EOS ids always stop); ``speculative_tokens`` None for the model's default, 0 for plain
    decoding; ``draft_sampling`` "greedy" or "sample". Sampling warpers (HF's): ``top_k`` (0: off),
    ``min_p`` in [0, 1]; processors (``processors``; greedy decoding honours them too):
    ``repetition_penalty`` > 0 (HF), ``presence_penalty`` and ``frequency_penalty`` in [-2, 2]
    (OpenAI), ``logit_bias`` (token id -> bias in [-100, 100]), ``min_new_tokens`` (EOS masked until
    then). Constrained output (``constraint``; at most one of these): ``json_schema`` (a dict or
    its JSON text), ``json_object`` (True: any JSON object), ``regex``, ``grammar`` (a Lark grammar
    in llguidance's syntax), ``choice`` (a list of strings); the allowed tokens are masked before
    the processors and warpers, and the request stops when the grammar ends. ``segments``: pieces
    laid out before the prompt (``segments`` module, ``docs/segments.md``): text, token ids, or
    ``Segment`` handles from ``LanguageModel.register_segment``, each segment's KV spliced at the
    next page boundary instead of computed.

    Validated on construction: RequestTypeError (a TypeError and a ValueError) for a field of the
    wrong type, RequestError (a ValueError) for a value out of range, both with the field in
    ``field``."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    logprobs: bool | int = False
    stop: Any = None
    speculative_tokens: int | str | None = None
    draft_sampling: str = "greedy"
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Any = None
    min_new_tokens: int = 0
    n: int = 1
    prompt_logprobs: int | None = None
    draft_tree: tuple[int, ...] | None = None
    json_schema: Any = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: Any = None
    segments: Any = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_new_tokens):
            raise RequestTypeError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}",
                                   field="max_new_tokens")
        if self.max_new_tokens < 0:
            raise RequestError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}",
                               field="max_new_tokens")
        if not _is_number(self.temperature):
            raise RequestTypeError(f"temperature must be a number, got {self.temperature!r}",
                                   field="temperature")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise RequestError("temperature must be a finite number >= 0, got "
                               f"{self.temperature!r}", field="temperature")
        # greedy: dividing by it would overflow (1e-300 is 0 in float32)
        if self.temperature < GREEDY_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if not _is_number(self.top_p):
            raise RequestTypeError(f"top_p must be a number, got {self.top_p!r}", field="top_p")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p!r}", field="top_p")
        if not _is_int(self.seed):
            raise RequestTypeError(f"seed must be an int, got {self.seed!r}", field="seed")
        if not -(1 << 63) <= self.seed <= MAX_SEED:
            raise RequestError(f"seed must be in [-2**63, 2**64), got {self.seed}", field="seed")
        # a negative (e.g. Java long) seed: its 64 bits
        object.__setattr__(self, "seed", self.seed & MAX_SEED)
        self._check_logprobs()
        if self.speculative_tokens is not None and self.speculative_tokens != AUTO:
            if not isinstance(self.speculative_tokens, int) or \
                    isinstance(self.speculative_tokens, bool):
                raise RequestTypeError(f'speculative_tokens must be None, "auto" or an int, got '
                                       f"{self.speculative_tokens!r}", field="speculative_tokens")
            if self.speculative_tokens < 0:
                raise RequestError(f"speculative_tokens must be None, \"auto\" or an int >= 0, got "
                                   f"{self.speculative_tokens}", field="speculative_tokens")
        if self.draft_sampling not in DRAFT_SAMPLING:
            raise RequestError('draft_sampling must be "greedy" or "sample", got '
                               f'{self.draft_sampling!r}', field="draft_sampling")
        self._check_processors()
        object.__setattr__(self, "_constraint", constraint_of(
            self.json_schema, self.json_object, self.regex, self.grammar, self.choice))
        for entry in self.stop_entries():
            if not isinstance(entry, str) and not (_is_int(entry) and entry >= 0):
                raise RequestTypeError("stop entries must be token ids (ints >= 0) or "
                                       f"strings, got {entry!r}", field="stop")
        object.__setattr__(self, "segments", check_pieces(self.segments))

    def _check_logprobs(self) -> None:
        if not isinstance(self.logprobs, bool):
            if not _is_int(self.logprobs):
                raise RequestTypeError(f"logprobs must be a bool or an int in [0, {MAX_LOGPROBS}], "
                                       f"got {self.logprobs!r}", field="logprobs")
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise RequestError(f"logprobs must be a bool or an int in [0, {MAX_LOGPROBS}], "
                                   f"got {self.logprobs}", field="logprobs")
        if self.prompt_logprobs is not None:
            if not _is_int(self.prompt_logprobs):
                raise RequestTypeError("prompt_logprobs must be None or an int in [0, "
                                       f"{MAX_LOGPROBS}], got {self.prompt_logprobs!r}",
                                       field="prompt_logprobs")
            if not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
                raise RequestError("prompt_logprobs must be None or an int in "
                                   f"[0, {MAX_LOGPROBS}], got {self.prompt_logprobs}",
                                   field="prompt_logprobs")
        if self.draft_tree is not None:
            tree = self.draft_tree
            if not isinstance(tree, (tuple, list)) or not tree or not all(_is_int(b) for b in tree):
                raise RequestTypeError("draft_tree must be None or a non-empty tuple of ints "
                                       f"(alternatives per depth), got {tree!r}",
                                       field="draft_tree")
            if len(tree) > MAX_TREE_DEPTH or not all(1 <= b <= MAX_BRANCHING for b in tree) or \
                    sum(tree) > MAX_TREE_NODES:
                raise RequestError(f"draft_tree must have 1..{MAX_TREE_DEPTH} depths of "
                                   f"1..{MAX_BRANCHING} alternatives each and at most "
                                   f"{MAX_TREE_NODES} nodes in all, got {tree!r}",
                                   field="draft_tree")
            object.__setattr__(self, "draft_tree", tuple(tree))
            # "auto" too
            if self.speculative_tokens is not None and self.speculative_tokens != len(tree):
                raise RequestError(f"speculative_tokens ({self.speculative_tokens}) must be None "
                                   f"or the depth of draft_tree ({len(tree)})",
                                   field="speculative_tokens")
        if not _is_int(self.n):
            raise RequestTypeError(f"n must be an int, got {self.n!r}", field="n")
        if not 1 <= self.n <= MAX_SAMPLES:
            raise RequestError(f"n must be in [1, {MAX_SAMPLES}], got {self.n}", field="n")

    @property
    def constraint(self) -> Constraint | None:
        """The output constraint the fields ask for (None: free text), checked
        (``constraint.constraint_of``)."""
        return cast("Constraint | None", getattr(self, "_constraint"))

    @property
    def wants_logprobs(self) -> bool:
        """Whether the chosen tokens' logprobs are returned (``logprobs`` True or an int)."""
        return self.logprobs is not False

    @property
    def top_logprobs(self) -> int:
        """Alternatives returned per generated token (0: none)."""
        return 0 if isinstance(self.logprobs, bool) else int(self.logprobs)

    def sample(self, index: int) -> SamplingParams:
        """The settings of sample ``index`` of ``n``: one sample, the same seed for sample 0 (so
        ``n=1`` and the first of ``n`` agree) and a distinct derived nonzero seed for the others
        (seed 0 stays nondeterministic)."""
        seed = self.seed
        if seed and index:
            seed = (seed + index * 0x9E3779B97F4A7C15) & MAX_SEED or 1
        return replace(self, n=1, seed=seed,
                       prompt_logprobs=self.prompt_logprobs if index == 0 else None)

    def _check_processors(self) -> None:
        if not _is_int(self.top_k):
            raise RequestTypeError(f"top_k must be an int, got {self.top_k!r}", field="top_k")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0 (0: off), got {self.top_k}", field="top_k")
        for name, lo, hi, lo_open in (("min_p", 0.0, 1.0, False),
                                      ("repetition_penalty", 0.0, math.inf, True),
                                      ("presence_penalty", -2.0, 2.0, False),
                                      ("frequency_penalty", -2.0, 2.0, False)):
            value = getattr(self, name)
            if not _is_number(value):
                raise RequestTypeError(f"{name} must be a number, got {value!r}", field=name)
            if not math.isfinite(value) or value < lo or value > hi or (lo_open and value <= lo):
                allowed = f"> {lo}" if lo_open else f"in [{lo}, {hi}]"
                raise RequestError(f"{name} must be {allowed}, got {value!r}", field=name)
        if not _is_int(self.min_new_tokens):
            raise RequestTypeError(f"min_new_tokens must be an int, got {self.min_new_tokens!r}",
                                   field="min_new_tokens")
        if self.min_new_tokens < 0:
            raise RequestError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}",
                               field="min_new_tokens")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise RequestTypeError("logit_bias must be a dict of token id -> bias, got "
                                       f"{self.logit_bias!r}", field="logit_bias")
            for token, bias in self.logit_bias.items():
                if not _is_int(token) or token < 0:
                    raise RequestError("logit_bias keys must be token ids (ints >= "
                                       f"0), got {token!r}", field="logit_bias")
                if not _is_number(bias) or not -100.0 <= bias <= 100.0:
                    raise RequestError(f"logit_bias[{token}] must be a number in [-100, "
                                       f"100], got {bias!r}", field="logit_bias")

    def processing(self, eos_ids: tuple[int, ...]) -> LogitsProcessing:
        """The request's logits processors (``processors``), with the model's EOS ids for
        ``min_new_tokens``."""
        bias = tuple(sorted((int(t), float(b)) for t, b in (self.logit_bias or {}).items()))
        return LogitsProcessing(float(self.repetition_penalty), float(self.presence_penalty),
                                float(self.frequency_penalty), bias, int(self.min_new_tokens),
                                eos_ids)

    def stop_entries(self) -> list[Any]:
        """``stop`` as a list (None: empty; a single id or string: one entry)."""
        if self.stop is None:
            return []
        if isinstance(self.stop, (list, tuple)):
            return list(self.stop)
        return [self.stop]


SAMPLING_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(SamplingParams))
# SamplingParams fields generate() and generate_batch() take as keywords beyond their signature
OPTION_FIELDS = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                 "logit_bias", "min_new_tokens", "prompt_logprobs", "draft_tree")
# every keyword each LanguageModel call accepts, as its errors list them
BATCH_KEYWORDS = SAMPLING_FIELDS
STREAM_KEYWORDS = SAMPLING_FIELDS + ("cancel",)
GENERATE_KEYWORDS = SAMPLING_FIELDS + ("listener", "cancel", "on_round")
CHAT_KEYWORDS = GENERATE_KEYWORDS + ("tools", "chat_template_kwargs")


def option_fields(given: dict[str, Any], call: str, accepted: tuple[str, ...]) -> dict[str, Any]:
    """``given`` (the keywords ``call`` did not name in its signature) if it holds only
    ``SamplingParams``' fields; RequestTypeError (a TypeError) for another name, suggesting the
    closest of ``accepted`` and listing them all."""
    check_keywords([k for k in given if k not in OPTION_FIELDS], accepted, call)
    return given


@dataclass(frozen=True)
class Request:
    """A validated request, ready for the scheduler: prompt ids, settings, ``max_new_tokens``
    (the caller's, clamped so that prompt plus completion fit ``max_seq_len``), resolved stops,
    the drafts per round (0: plain decoding), and the caller's hooks: ``listener``
    (GenerationListener-like), ``cancel`` (polled before every forward of the request; True ends
    it with GenerationCancelled) and ``on_round`` (called with each speculative round's
    ``RoundRecord``)."""

    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int  # the one internal name of the token budget (see docs/contract.md)
    stop_ids: frozenset[int]
    stop_texts: tuple[str, ...]
    speculative_tokens: int
    listener: GenerationListener | None = None
    cancel: Callable[[], bool] | None = None
    on_round: Callable[[RoundRecord], None] | None = None
    # the model's draft policy chooses each round's drafts, up to ``speculative_tokens``
    adaptive: bool = False
    # the compiled output constraint (None: free text); each row starts its own state of it
    compiled_grammar: CompiledGrammar | None = None
    # registered segments placed in the prompt, their KV spliced instead of computed (in order)
    splices: tuple[Splice, ...] = ()
    # one listener per sample of an ``n``-sample request (empty: ``listener`` alone, for n = 1)
    sample_listeners: tuple[GenerationListener | None, ...] = ()


class HandleOwner(Protocol):
    """What a handle waits on and cancels through (the serving loop that queued it)."""

    def wait(self, handle: RequestHandle, timeout: float | None = None) -> None: ...

    def cancel(self, handle: RequestHandle) -> bool: ...


class RequestHandle:
    """A submitted request, future-like and safe from any thread: ``result()`` waits for its
    Completion (or raises what ended it: GenerationCancelled, KvCacheExhaustedError if it can never
    fit the pool, EngineShutdownError, the error of its listener or ``cancel`` hook, or the error of
    a failed forward). While a caller waits and no other thread is advancing the model, the waiting
    thread advances it itself (no thread hop for a single caller)."""

    def __init__(self, request_number: int, request: Request, owner: HandleOwner) -> None:
        self.request_number = request_number  # submission order on its model, from 1
        self.request = request
        self.prompt = request.prompt
        self._owner = owner
        self._done = threading.Event()
        self._result: Completion | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[RequestHandle], None]] = []
        self._callbacks_lock = threading.Lock()
        self.cancel_requested = False

    def done(self) -> bool:
        """True once the request finished, failed or was cancelled (never blocks)."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Completion:
        """The Completion; raises the request's error, or TimeoutError if not done within
        ``timeout`` seconds. RuntimeError if called from a listener while the request is not done
        (it would wait on the thread that must advance it)."""
        self._owner.wait(self, timeout)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error that ended the request, or None if it completed; waits like ``result``."""
        self._owner.wait(self, timeout)
        return self._error

    def cancel(self) -> bool:
        """Abort the request: a queued one leaves the queue, a running one is evicted; its KV pages
        are released when this returns (from a listener, at the end of the current step). False if
        it had already finished."""
        return bool(self._owner.cancel(self))

    def add_done_callback(self, fn: Callable[[RequestHandle], None]) -> None:
        """Call ``fn(handle)`` once the request is done: at once on the calling thread if it already
        is, otherwise on the thread that ends it (the driver's, inside a step, after the request's
        last listener call, or a thread cancelling it). ``fn`` must return quickly and must not wait
        on a request; an exception from it is ignored (the request's outcome is already settled).
        Safe from any thread; callbacks run in the order added."""
        with self._callbacks_lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        _call_quietly(fn, self)

    # ------------------------------------------------------------------ the serving loop's side
    def _set_result(self, completion: Completion) -> None:
        if not self._done.is_set():
            self._result = completion
            self._settle()

    def _set_error(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._settle()

    def _settle(self) -> None:
        with self._callbacks_lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _call_quietly(fn, self)


def _call_quietly(fn: Callable[[RequestHandle], None], handle: RequestHandle) -> None:
    try:
        fn(handle)
    except Exception:  # noqa: BLE001 - a done callback cannot change a settled request
        pass
