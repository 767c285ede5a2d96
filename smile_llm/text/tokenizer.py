"""Tokenizers: the built-in byte-level tokenizer (ids 0-255 are bytes, 256 is ``<|endoftext|>``) and
Hugging Face ``tokenizer.json`` files through the ``tokenizers`` library. Both decode incrementally
without splitting a UTF-8 character across text chunks."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import TokenizerError
from ..json_file import read_json

MAX_SPEC_BYTES = 1 << 20  # a smile_tokenizer.json larger than this is refused before it is parsed


class Tokenizer(Protocol):
    """What ``LanguageModel`` needs of a tokenizer: ``vocab_size``, ``eos_token_ids``,
    ``encode`` and ``decode``."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (special tokens dropped)."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; special ids from 256 (``<|endoftext|>`` is 256) decode to nothing.

    >>> tok = ByteTokenizer()
    >>> tok.encode("héllo")
    [104, 195, 169, 108, 108, 111]
    >>> tok.decode(tok.encode("héllo") + [256])
    'héllo'
    >>> tok.vocab_size, tok.eos_token_ids
    (257, (256,))
    """

    def __init__(self, vocab_size: int = 257, eos_token_id: int = 256) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids: tuple[int, ...] = (eos_token_id,)

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids 0-255."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """``ids`` below 256 decoded as UTF-8 (invalid bytes become U+FFFD); special
        ids are dropped."""
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizer.json`` read by the ``tokenizers`` library. TokenizerError (a ValueError) naming
    the file when the library cannot read it (not JSON, not a tokenizer)."""

    def __init__(self, path: Path, eos_token_ids: tuple[int, ...]) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        try:
            self._tok = _Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises plain Exception for a malformed file
            raise TokenizerError(f"is not a tokenizer file the tokenizers library can read: {exc}",
                                 path=path) from None
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_token_ids = eos_token_ids

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens skipped."""
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` text (for the grammar engine's token table)."""
        return str(self._tok.to_str())


def load_tokenizer(folder: Path, eos_token_ids: tuple[int, ...], vocab_size: int) -> Tokenizer:
    """The folder's tokenizer, the first found of:

    - ``smile_tokenizer.json``: the byte tokenizer, explicitly (a JSON object whose ``vocab_size``
      is an integer above 256 and whose ``eos_token_id`` is an id below it). It takes precedence
      over a ``tokenizer.json`` beside it: the shipped byte-level models carry both, the
      ``tokenizer.json`` (the same tokenizer in Hugging Face's format) for other tools, and the
      package uses the faster byte tokenizer, from which the grammar engine's token table is built;
    - ``tokenizer.json``, read by the ``tokenizers`` library;
    - else the byte tokenizer with ``vocab_size`` and the first of ``eos_token_ids``.

    TokenizerError (a ValueError) naming the file and the field when the one chosen is
    malformed."""
    spec = folder / "smile_tokenizer.json"
    if spec.is_file():
        return _byte_tokenizer(spec, vocab_size)
    if (folder / "tokenizer.json").is_file():
        return HFTokenizer(folder / "tokenizer.json", eos_token_ids)
    return ByteTokenizer(vocab_size, eos_token_ids[0] if eos_token_ids else 256)


def _byte_tokenizer(spec: Path, vocab_size: int) -> ByteTokenizer:
    meta = read_json(spec, MAX_SPEC_BYTES, lambda message: TokenizerError(message, path=spec))
    if not isinstance(meta, dict):
        raise TokenizerError(f"must hold a JSON object, got {type(meta).__name__}", path=spec)
    vocab = meta.get("vocab_size", vocab_size)
    if not _is_int(vocab) or vocab <= 256:
        raise TokenizerError("vocab_size must be an integer above 256 (bytes and <|endoftext|>), "
                             f"got {vocab!r}", path=spec, field="vocab_size")
    eos = meta.get("eos_token_id", 256)
    if not _is_int(eos) or not 0 <= eos < vocab:
        raise TokenizerError(f"eos_token_id must be an integer in [0, {vocab}), got {eos!r}",
                             path=spec, field="eos_token_id")
    return ByteTokenizer(vocab, eos)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class StreamDecoder:
    """Turns a growing id list into text chunks, holding back an unfinished UTF-8 character. Each
    step decodes only the ids since the last emitted chunk (prefix/read offsets, as vLLM does), so
    streaming is linear.

    >>> stream = StreamDecoder(ByteTokenizer())
    >>> # "é" is two bytes: nothing comes out until both arrived
    >>> [stream.push(t) for t in "hé!".encode("utf-8")]
    ['h', '', 'é', '!']
    >>> stream.finish()
    ''
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        # ids[prefix:read] decode to the text emitted last (context for the next chunk)
        self.prefix = 0
        self.read = 0

    def push(self, token: int) -> str:
        """The new text after ``token`` (empty while a character is incomplete)."""
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        text = self.tokenizer.decode(self.ids[self.prefix :])
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before) :]

    def finish(self) -> str:
        """Whatever is still held back at the end (an incomplete character decodes to U+FFFD)."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        text = self.tokenizer.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return text[len(before) :]
