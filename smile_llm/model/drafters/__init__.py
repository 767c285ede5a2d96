"""Drafters for speculative decoding behind one protocol (``Drafter``): the MTP head with a per-request history
(``MtpHistoryDrafter``) or per round (``MtpPerRoundDrafter``), and n-gram prompt lookup (``NgramDrafter``).
``build_drafter`` turns ``LanguageModel``'s ``drafter``/``draft_kv`` arguments into one."""

from __future__ import annotations

from ...attention.backend import AttentionBackend
from ...cache import KvCachePool
from ..config import MAX_SPECULATIVE_TOKENS
from ..transformer import Transformer
from .base import Drafter
from .mtp import MtpDrafterBase, MtpHistory
from .mtp_history import MtpHistoryDrafter
from .mtp_per_round import MtpPerRoundDrafter
from .ngram import NgramDrafter, find_ngram_match

__all__ = ["Drafter", "MtpDrafterBase", "MtpHistory", "MtpHistoryDrafter", "MtpPerRoundDrafter", "NgramDrafter",
           "build_drafter", "find_ngram_match"]

DRAFT_KV = ("history", "per_round")


def build_drafter(choice: object, transformer: Transformer, pool: KvCachePool, backend: AttentionBackend,
                  max_seq_len: int, draft_kv: str = "history") -> Drafter | None:
    """The drafter ``choice`` names: ``"mtp"`` (the checkpoint's MTP head when it has one, else none; ``draft_kv``
    "history" or "per_round" picks the class; none when the history pool does not fit in memory), ``"ngram"``
    (``NgramDrafter()`` with vLLM's defaults), ``None`` or ``"none"`` (plain decoding), or a ``Drafter`` instance
    (used as is). ValueError for anything else, a bad ``draft_kv``, or a drafter whose ``num_speculative_tokens``
    is not an int in ``1..MAX_SPECULATIVE_TOKENS``."""
    if draft_kv not in DRAFT_KV:
        raise ValueError(f'draft_kv must be "history" or "per_round", got {draft_kv!r}')
    if choice is None or choice == "none":
        return None
    if choice == "ngram":
        return NgramDrafter()
    if choice == "mtp":
        if transformer.mtp is None:
            return None
        if draft_kv == "per_round":
            return MtpPerRoundDrafter.create(transformer, pool, backend, max_seq_len)
        try:
            return MtpHistoryDrafter.create(transformer, pool, backend, max_seq_len)
        except RuntimeError:  # too little memory for the draft history: decode without speculation
            return None
    if isinstance(choice, str) or not isinstance(choice, Drafter):
        raise ValueError(f'drafter must be "mtp", "ngram", None, "none" or a Drafter instance, got {choice!r}')
    n = choice.num_speculative_tokens
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"drafter.num_speculative_tokens must be an int in 1..{MAX_SPECULATIVE_TOKENS}, got {n!r}")
    return choice
