"""The grammar engine's view of a model's vocabulary: llguidance's ``LLTokenizer`` built from
the model's own tokenizer (a ``tokenizer.json`` through its JSON text, or the byte-level tokenizer
of the shipped models through its 256 byte tokens), sized to the model's logits (ids past the
tokenizer's own vocabulary are never allowed) and with the model's EOS ids as the tokens that end a
grammar. Building one can take a second for a large vocabulary: ``GrammarCompiler`` builds it once
per model."""

from __future__ import annotations

from typing import Any

from ..errors import ConstraintError
from ..text.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer


class _ByteTokens:
    """The byte tokenizer in llguidance's ``TokenizerWrapper`` shape: ids 0-255 are their bytes (all
    of them, as the engine needs; a model with fewer logits never writes the others, see
    ``GrammarCompiler.compile``), every id from 256 a special token (named as it decodes
    nowhere)."""

    bos_token_id = None

    def __init__(self, vocab_size: int, eos_token_id: int) -> None:
        self.eos_token_id = eos_token_id
        self.tokens = [bytes([i]) for i in range(256)] + [
            f"<|special_{i}|>".encode() for i in range(256, vocab_size)]
        self.special_token_ids = list(range(256, vocab_size))

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)


def token_table(tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> Any:
    """llguidance's ``LLTokenizer`` for ``tokenizer`` over ``vocab_size`` ids (the logits' width).
    ConstraintError (field ``tokenizer``) for a tokenizer that exposes no token table, or one the
    engine cannot read."""
    from llguidance import LLTokenizer, TokenizerWrapper

    eos: list[int] = [e for e in eos_token_ids if 0 <= e < vocab_size]
    try:
        if isinstance(tokenizer, HFTokenizer):
            return LLTokenizer(tokenizer.to_json(), n_vocab=vocab_size, eos_token=eos or None)
        if isinstance(tokenizer, ByteTokenizer):
            words = _ByteTokens(max(vocab_size, tokenizer.vocab_size),
                                eos[0] if eos else tokenizer.eos_token_ids[0])
            return LLTokenizer(TokenizerWrapper(words), n_vocab=len(words.tokens),
                               eos_token=eos or None)
    except Exception as exc:  # the engine's own message (it raises ValueError or RuntimeError)
        raise ConstraintError(f"the grammar engine cannot read the model's tokenizer: {exc}",
                              field="tokenizer") from None
    raise ConstraintError(f"the model's tokenizer ({type(tokenizer).__name__}) has no token table "
                          "for constrained output (a tokenizer.json or the byte tokenizer has)",
                          field="tokenizer")
