"""Drafters for speculative decoding behind one protocol (``Drafter``): the MTP head with a
per-request history (``MtpHistoryDrafter``) or per round (``MtpPerRoundDrafter``), n-gram prompt
lookup (``NgramDrafter``), a smaller checkpoint of the same vocabulary (``DraftModelDrafter``), and
yours (``register_drafter``). ``build_drafter`` turns ``LanguageModel``'s ``drafter``/``draft_kv``
arguments into one."""

from __future__ import annotations

from ...attention.backend import AttentionBackend
from ...cache import KvCachePool
from ...models.checkpoint.config import MAX_SPECULATIVE_TOKENS
from ...models.transformer import Transformer
from .base import Drafter
from .draft_model import DraftModelDrafter
from .mtp_base import MtpDrafterBase, MtpHistory
from .mtp_history import MtpHistoryDrafter
from .mtp_per_round import MtpPerRoundDrafter
from .ngram import NgramDrafter, find_ngram_match
from .registry import (DrafterContext, DrafterFactory, LoadedModel, ModelLoader, find_factory,
                       register_drafter, registered_drafters, unregister_drafter)

__all__ = ["DraftModelDrafter", "Drafter", "DrafterContext", "DrafterFactory",
           "LoadedModel", "ModelLoader", "MtpDrafterBase", "MtpHistory", "MtpHistoryDrafter",
           "MtpPerRoundDrafter", "NgramDrafter", "build_drafter", "find_ngram_match",
           "register_drafter", "registered_drafters", "unregister_drafter"]

DRAFT_KV = ("history", "per_round")
DRAFT_MODEL_PREFIX = "draft:"


def _mtp(ctx: DrafterContext) -> Drafter | None:
    """The checkpoint's MTP head in ``ctx.draft_kv`` mode; None without a head, or (history mode)
    when the history pool does not fit in memory."""
    if not ctx.transformer.has_mtp:
        return None
    if ctx.draft_kv == "per_round":
        return MtpPerRoundDrafter.create(ctx.transformer, ctx.pool, ctx.backend, ctx.max_seq_len)
    try:
        return MtpHistoryDrafter.create(ctx.transformer, ctx.pool, ctx.backend, ctx.max_seq_len)
    except RuntimeError:  # too little memory for the draft history: decode without speculation
        return None


def accepted_forms() -> str:
    """The ``drafter`` choices, for error messages."""
    names = registered_drafters()
    registered = (f"a registered name ({', '.join(names)})" if names
                  else "a registered name (none registered)")
    return (f'"mtp", "ngram", "draft:PATH" (a draft model), {registered}, '
            '"package.module:callable", None, "none" '
            "or a Drafter instance")


def build_drafter(choice: object, transformer: Transformer, pool: KvCachePool,
                  backend: AttentionBackend, max_seq_len: int,
                  draft_kv: str = "history", load_model: ModelLoader | None = None
                  ) -> Drafter | None:
    """The drafter ``choice`` names: ``"mtp"`` (the checkpoint's MTP head when it has one, else
    none; ``draft_kv`` "history" or "per_round" picks the class; none when the history pool does not
    fit in memory), ``"ngram"`` (``NgramDrafter()`` with vLLM's defaults), ``"draft:PATH"``
    (``DraftModelDrafter.load(PATH, ...)``: the checkpoint at PATH drafts, loaded by
    ``load_model``), a name given to ``register_drafter`` or a ``"package.module:callable"`` string
    (the factory called with a ``DrafterContext``; None from it means plain decoding), ``None`` or
    ``"none"`` (plain decoding), or a ``Drafter`` instance (used as is). ValueError listing the
    accepted forms for anything else, for a bad ``draft_kv``, for a factory that returns something
    else than a Drafter or None, or for a drafter whose ``num_speculative_tokens`` is not an int in
    ``1..MAX_SPECULATIVE_TOKENS``."""
    if draft_kv not in DRAFT_KV:
        raise ValueError(f'draft_kv must be "history" or "per_round", got {draft_kv!r}')
    if choice is None or choice == "none":
        return None
    ctx = DrafterContext(transformer, pool, backend, max_seq_len, draft_kv, load_model)
    if choice == "ngram":
        return NgramDrafter()
    if choice == "mtp":
        return _mtp(ctx)
    if isinstance(choice, str) and choice.startswith(DRAFT_MODEL_PREFIX):
        return DraftModelDrafter.load(choice[len(DRAFT_MODEL_PREFIX) :], ctx)
    if isinstance(choice, str):
        factory = find_factory(choice)
        if factory is None:
            raise ValueError(f"drafter must be {accepted_forms()}; got the unknown name {choice!r}")
        made = factory(ctx)
        if made is None:
            return None
        if not isinstance(made, Drafter):
            raise ValueError(f"the drafter factory {choice!r} returned {made!r}, not a "
                             "Drafter (or None)")
        choice = made
    if not isinstance(choice, Drafter):
        raise ValueError(f"drafter must be {accepted_forms()}, got {choice!r}")
    n = choice.num_speculative_tokens
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SPECULATIVE_TOKENS:
        raise ValueError("drafter.num_speculative_tokens must be an int in "
                         f"1..{MAX_SPECULATIVE_TOKENS}, got {n!r}")
    return choice
