"""A Java ``smile.llm.SamplingParams`` as Python's ``SamplingParams``, and Python's field names in
error messages turned into the Java names the caller wrote.

Validation happens once, in Python: the Java builder checks nothing (but an empty ``choice`` list),
and ``python_params`` hands every field to ``SamplingParams``, whose ``RequestError`` carries the
Python field (``field``); the message is then rewritten to lead with the Java name and keep the
Python one (``"topK (top_k) must be >= 0 (0: off), got -1"``; the same for a ConstraintError).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from jpype import JClass, JString

from smile_llm import AUTO, RequestError, SamplingParams

from .segments import python_pieces

# Python field -> the Java SamplingParams builder's name (fields spelled alike in both are left out)
BUILDER_NAMES = {"max_new_tokens": "maxNewTokens", "top_p": "topP", "top_k": "topK",
                 "min_p": "minP", "repetition_penalty": "repetitionPenalty",
                 "presence_penalty": "presencePenalty", "frequency_penalty": "frequencyPenalty",
                 "logit_bias": "logitBias", "min_new_tokens": "minNewTokens",
                 "speculative_tokens": "speculativeTokens", "draft_sampling": "draftSampling",
                 "prompt_logprobs": "promptLogprobs", "draft_tree": "draftTree",
                 "json_schema": "jsonSchema", "json_object": "jsonObject"}
# Python field -> the parameter of Smile's positional generate/submit/stream and GenerationRequest
SMILE_NAMES = {"max_new_tokens": "maxGenLen", "top_p": "topp"}

def java_named(exc: Exception, names: Mapping[str, str]) -> Exception:
    """``exc`` with its ``field`` (a ``RequestError``'s), when ``names`` has it and the message
    leads with it, called ``"javaName (python_name)"`` in the message: an error of the same type
    whose ``field`` is still the Python name; ``exc`` itself when there is nothing to rename."""
    if not isinstance(exc, RequestError) or exc.field not in names:
        return exc
    text = exc.renamed(f"{names[exc.field]} ({exc.field})")
    if text == str(exc):
        return exc
    renamed = type(exc).__new__(type(exc), text)
    renamed.args = (text,)
    renamed.__dict__.update(exc.__dict__)
    renamed.__cause__ = exc.__cause__
    return renamed


@contextmanager
def named_errors(names: Mapping[str, str]) -> Iterator[None]:
    """Re-raise a ``RequestError`` from the block with its field renamed by ``java_named``."""
    try:
        yield
    except RequestError as exc:
        renamed = java_named(exc, names)
        if renamed is exc:
            raise
        raise renamed from None


_java_class: Any = None


def is_java_params(value: Any) -> bool:
    """True for a Java ``smile.llm.SamplingParams``."""
    global _java_class
    if _java_class is None:
        _java_class = JClass("smile.llm.SamplingParams")
    return isinstance(value, _java_class)


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def python_params(params: Any) -> SamplingParams:
    """Python's ``SamplingParams`` of a Java ``smile.llm.SamplingParams``, validated there.
    ``RequestError`` naming the field (Java and Python names) for a bad value; ValueError for
    null.

    The Java ``logprobs`` (null, 0, or k) becomes False, True, or k; stop strings and stop token ids
    become one ``stop`` list (strings first); ``speculativeTokensAuto()`` becomes
    ``speculative_tokens="auto"``; the ``draftTree`` list becomes a tuple; an empty list or map
    becomes None. The constraint fields (``jsonSchema`` text, ``jsonObject``, ``regex``,
    ``grammar``, the ``choice`` list) are passed only when set (non-null, ``jsonObject`` true, a
    non-empty ``choice``; an empty string is set, for Python to refuse); Python checks them (at most
    one, ConstraintError naming the field) and the model compiles them when the request is made.
    The ``segments`` pieces become Python's (``segments.python_pieces``)."""
    if params is None:
        raise ValueError("params must not be null: build one with "
                         "SamplingParams.builder()...build()")
    if not is_java_params(params):
        raise TypeError(f"params must be a smile.llm.SamplingParams, got {type(params).__name__}")
    logprobs = params.logprobs()
    stop: list[Any] = [None if s is None else str(s) for s in params.stop()]
    stop += [_optional_int(t) for t in params.stopTokenIds()]
    bias = params.logitBias()
    fields: dict[str, Any] = {
        "max_new_tokens": int(params.maxNewTokens()), "temperature": float(params.temperature()),
        "top_p": float(params.topP()), "seed": int(params.seed()),
        "logprobs": False if logprobs is None else True if int(logprobs) == 0 else int(logprobs),
        "stop": stop or None,
        "speculative_tokens": AUTO if params.speculativeTokensAuto()
                              else _optional_int(params.speculativeTokens()),
        "draft_sampling": None if params.draftSampling() is None else str(params.draftSampling()),
        "top_k": int(params.topK()), "min_p": float(params.minP()),
        "repetition_penalty": float(params.repetitionPenalty()),
        "presence_penalty": float(params.presencePenalty()),
        "frequency_penalty": float(params.frequencyPenalty()),
        "logit_bias": {_optional_int(k): None if bias.get(k) is None else float(bias.get(k))
                       for k in bias.keySet()} or None,
        "min_new_tokens": int(params.minNewTokens()),
        "n": int(params.n()), "prompt_logprobs": _optional_int(params.promptLogprobs()),
        "draft_tree": tuple(int(b) for b in params.draftTree()) or None,
    }
    fields.update(_constraint_fields(params))
    fields["segments"] = python_pieces(params.segments())
    with named_errors(BUILDER_NAMES):
        return SamplingParams(**fields)


def _constraint_fields(params: Any) -> dict[str, Any]:
    """The constraint fields set on Java ``params``, by their Python names (none when unset)."""
    fields: dict[str, Any] = {}
    for name, value in (("json_schema", params.jsonSchema()), ("regex", params.regex()),
                        ("grammar", params.grammar())):
        if value is not None:
            fields[name] = str(value)
    if params.jsonObject():
        fields["json_object"] = True
    # empty: unset (build() refuses []); Python refuses an element that is no String (raw types)
    choice = [str(c) if isinstance(c, JString) else c for c in params.choice()]
    if choice:
        fields["choice"] = choice
    return fields


def single(params: SamplingParams) -> SamplingParams:
    """``params`` for a call that returns one completion; ``RequestError`` (field ``n``) when it
    asks for ``n > 1`` samples."""
    if params.n != 1:
        raise RequestError(f"n is {params.n}: this call returns one completion; use "
                           f"generateSamples(prompt, params) for n samples", field="n")
    return params
