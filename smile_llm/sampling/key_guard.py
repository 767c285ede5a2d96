"""No JSON object of a constrained output repeats a key.

A grammar cannot remember which keys an object already has, and the grammar engine lets an object
that admits undeclared keys repeat them (``json_object=True``, ``additionalProperties: true``,
``patternProperties``; a declared name is kept out of the undeclared keys only as written, so
``"\\u0061"`` may follow ``"a"``). The guard follows the output's JSON as it grows (``KeyScan``:
the objects open at this point, the keys each already holds, the key being written) and takes out
of the grammar's mask every token that would close a key its object already holds
(``forbidden``): keys are compared decoded (``\\"``, ``\\u0041``, surrogate pairs), as UTF-8.

A token with one ``"`` can close a key only from inside it: its decoded text before the quote,
added to the key's so far, is looked up (``KeyTable.closing``: one dictionary look-up per key the
object holds). A token with two or more (``"id"``, ``", "id"``) may open and close a key by
itself: those the grammar allows here are followed byte by byte (few: the grammar allows such
tokens only where JSON punctuation may come).

A key language may be finite (``patternProperties: {"^(in|on|at)$": ...}``): once ``"in"`` is held,
``"i`` leads where only a repeat can follow, and once all three are, so does ``,``. ``risky``
gives the tokens that lead towards such a place (a key kept a prefix of a held one, a new member
begun in an object that holds keys) for ``GrammarState`` to look ahead with the grammar and take
out those after which no new key can be finished.

``mode``: ``"json"`` when the whole output is one JSON value (``json_schema``, ``json_object``);
``"embedded"`` when JSON objects sit in other text (a Lark grammar with ``%json`` parts, as the
server's tool calls): outside an object only ``{`` counts, opening one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

QUOTE, BACKSLASH = 0x22, 0x5C
_SIMPLE_ESCAPES = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b",
                   ord("f"): b"\f", ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}
# string states of a scan
OUTSIDE, IN_KEY, IN_VALUE = 0, 1, 2
Frame = tuple[frozenset[bytes], bool] | None  # an object (its keys, whether a key comes next)


class KeyTable:
    """What the tokens of a table (``token_bytes``: each id's bytes) do to keys: ``closing``
    (decoded text before the quote of a one-quote token read inside a key -> ids), ``multi``
    (ids with two or more quotes), ``texts`` (decoded text of a token without quotes -> ids),
    ``commas`` (ids holding a ``,``), ``quoted`` ((id, bytes) of every id with a quote) and their
    ``quote_ids``."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self.token_bytes = token_bytes
        self.quoted = [(t, b) for t, b in enumerate(token_bytes) if b'"' in b]
        self.quote_ids = np.array([t for t, _ in self.quoted], dtype=np.int64)
        self.multi = np.array([t for t, b in self.quoted if b.count(b'"') > 1], dtype=np.int64)
        self.commas = np.array([t for t, b in enumerate(token_bytes) if b"," in b],
                               dtype=np.int64)
        closing: dict[bytes, list[int]] = {}
        texts: dict[bytes, list[int]] = {}
        for t, b in enumerate(token_bytes):
            quotes = b.count(b'"')
            if quotes == 1:
                text = decoded(b[: b.index(b'"')])
                if text is not None and quote_at(b, False) == b.index(b'"'):
                    closing.setdefault(text, []).append(t)
            elif quotes == 0 and b:
                text, end = decode_prefix(b, final=True)
                if end == len(b):
                    texts.setdefault(text, []).append(t)
        self.closing = {k: np.array(v, dtype=np.int64) for k, v in closing.items()}
        self.texts = {k: np.array(v, dtype=np.int64) for k, v in texts.items()}
        self.longest = max(map(len, texts), default=0)  # the longest decoded text of one token
        # what a token does from between two members of an object, and from before a key
        self.after_member = Openers(token_bytes, self.commas.tolist(), False)
        blank = b" \t\r\n"
        self.before_key = Openers(token_bytes, [t for t, b in enumerate(token_bytes) if b and (
            not b.strip(blank) or b.lstrip(blank).startswith(b'"'))], True)

    @classmethod
    def of(cls, table: Any, vocab_size: int) -> KeyTable:
        """The key table of llguidance's ``LLTokenizer`` ``table`` (the bytes it gives each id
        below ``vocab_size``)."""
        return cls([bytes(table.decode_bytes([t])) for t in range(vocab_size)])


class Openers:
    """The tokens (of ``candidates``) that, read in an object between two members (or, with
    ``before_key``, before a key), stay in that object and begin a new member: ``gaps`` (ids) stop
    before its key, ``keys`` (the key's decoded text so far -> ids) stop inside it."""

    def __init__(self, token_bytes: list[bytes], candidates: list[int], before_key: bool) -> None:
        start = KeyScan("json", ((frozenset(), before_key),))
        gaps: list[int] = []
        keys: dict[bytes, list[int]] = {}
        for t in candidates:
            after = start.advance(token_bytes[t])
            if len(after.stack) != 1 or after.stack[0] is None or after.stack[0][0]:
                continue  # left the object, or wrote a whole key
            if after.string == IN_KEY:
                text, end = decode_prefix(after.raw)
                if end == len(after.raw):
                    keys.setdefault(text, []).append(t)
            elif after.string == OUTSIDE and after.stack[0][1]:
                gaps.append(t)
        self.gaps = np.array(gaps, dtype=np.int64)
        self.keys = {k: np.array(v, dtype=np.int64) for k, v in keys.items()}
        self.longest = max(map(len, keys), default=0)


class KeyScan:
    """Where a JSON output stands (immutable; ``advance`` gives the next). ``stack``: the open
    containers, innermost last, an object as ``(keys it holds, whether a key comes next)``, an
    array as None; ``string``: OUTSIDE, IN_KEY or IN_VALUE; ``raw``: a key's bytes so far as
    written (escapes undecoded), in a value string ``b"\\\\"`` while an escape is pending."""

    __slots__ = ("mode", "stack", "string", "raw")

    def __init__(self, mode: str, stack: tuple[Frame, ...] = (), string: int = OUTSIDE,
                 raw: bytes = b"") -> None:
        self.mode, self.stack, self.string, self.raw = mode, stack, string, raw

    def advance(self, data: bytes) -> KeyScan:
        """The scan after the output grows by ``data``."""
        return self._advance(data)[0]

    def repeats_key(self, data: bytes) -> bool:
        """Whether appending ``data`` closes a key its object already holds."""
        return self._advance(data)[1]

    def _advance(self, data: bytes) -> tuple[KeyScan, bool]:
        stack, string, raw = list(self.stack), self.string, self.raw
        repeated = False
        i, n = 0, len(data)
        while i < n:
            c = data[i]
            if string == IN_VALUE:
                if raw:  # the escaped byte
                    raw = b""
                    i += 1
                    continue
                stop = _next_special(data, i)
                if stop is None:
                    break
                i = stop
                if data[i] == BACKSLASH:
                    raw = b"\\"
                else:
                    string = OUTSIDE
                i += 1
                continue
            if string == IN_KEY:
                if c == QUOTE and not _escape_pending(raw):
                    key, top = decoded(raw), stack[-1]
                    if top is not None and key is not None:
                        repeated = repeated or key in top[0]
                        stack[-1] = (top[0] | {key}, False)
                    string, raw = OUTSIDE, b""
                else:
                    raw += data[i : i + 1]
                i += 1
                continue
            top = stack[-1] if stack else None
            if not stack and self.mode == "embedded":
                if c == ord("{"):
                    stack.append((frozenset(), True))
            elif c == QUOTE:
                string = IN_KEY if top is not None and top[1] else IN_VALUE
                raw = b""
            elif c == ord("{"):
                stack.append((frozenset(), True))
            elif c == ord("["):
                stack.append(None)
            elif c in (ord("}"), ord("]")):
                if stack:
                    stack.pop()
            elif c == ord(":") and top is not None:
                stack[-1] = (top[0], False)
            elif c == ord(",") and top is not None:
                stack[-1] = (top[0], True)
            i += 1
        return KeyScan(self.mode, tuple(stack), string, raw), repeated

    def held(self) -> frozenset[bytes] | None:
        """The keys of the innermost object, when it is the innermost container and holds any."""
        top = self.stack[-1] if self.stack else None
        return top[0] if top is not None and top[0] else None

    def forbidden(self, table: KeyTable, mask: np.ndarray) -> np.ndarray | None:
        """int64: the ids ``mask`` allows that would close a key its object already holds; None
        when there are none."""
        found = []
        keys = self.held() if self.string == IN_KEY else None
        if keys is not None:
            text, end = decode_prefix(self.raw)
            if end == len(self.raw):  # no escape pending: a look-up per held key
                found = [table.closing[k[len(text):]] for k in keys
                         if k.startswith(text) and k[len(text):] in table.closing]
            else:
                escaped = _escape_pending(self.raw)
                ids = [t for t, b in table.quoted if b.count(b'"') == 1 and
                       _closes(self.raw, b, escaped, keys)]
                found.append(np.array(ids, dtype=np.int64))
        if any(f is not None and f[0] for f in self.stack) and len(table.multi):
            multi = table.multi[allows(mask, table.multi)]
            words = table.token_bytes
            found.append(np.array([t for t in multi.tolist() if self.repeats_key(words[t])],
                                  dtype=np.int64))
        found = [f for f in found if len(f)]
        return np.concatenate(found) if found else None

    def risky(self, table: KeyTable, mask: np.ndarray) -> np.ndarray | None:
        """int64: the ids ``mask`` allows that lead towards a place where only a held key could
        follow, without closing a key: in a key, those that leave it a prefix of a held key (or
        that key, open); after a member of an object that holds keys, those that begin a new
        member; before its key, those that begin the key. None when there are none, or in a key
        whose bytes so far end inside an escape (not looked ahead from)."""
        keys = self.held()
        if keys is None:
            return None
        if self.string == IN_KEY:
            text, end = decode_prefix(self.raw)
            if end != len(self.raw):
                return None
            found = []
            for key in keys:
                if key.startswith(text) and len(key) > len(text):
                    rest = key[len(text):]
                    for size in range(1, min(len(rest), table.longest) + 1):
                        ids = table.texts.get(rest[:size])
                        if ids is not None:
                            found.append(ids)
            if not found:
                return None
            ids = np.unique(np.concatenate(found))
            return ids[allows(mask, ids)]
        if self.string != OUTSIDE:
            return None
        top = self.stack[-1]
        assert top is not None
        openers = table.before_key if top[1] else table.after_member
        found = [openers.gaps]
        for key in keys:
            for size in range(min(len(key), openers.longest) + 1):
                ids = openers.keys.get(key[:size])
                if ids is not None:
                    found.append(ids)  # a key begun as a prefix of a held one
        ids = np.unique(np.concatenate(found))
        ids = ids[allows(mask, ids)]
        return ids if len(ids) else None


def _closes(raw: bytes, token: bytes, escaped: bool, keys: frozenset[bytes]) -> bool:
    at = quote_at(token, escaped)
    return at is not None and decoded(raw + token[:at]) in keys


def allows(mask: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """bool: whether the int32 token mask ``mask`` ``[W]`` allows each of ``ids`` (int64)."""
    words = mask.view(np.uint32)
    inside = ids < words.shape[0] * 32
    bits = np.zeros(len(ids), dtype=bool)
    bits[inside] = ((words[ids[inside] >> 5] >> (ids[inside] & 31).astype(np.uint32)) & 1) == 1
    return bits


def forbid(mask: np.ndarray, ids: np.ndarray) -> None:
    """Clear the bits of ``ids`` in the int32 token mask ``mask`` ``[W]`` (in place)."""
    ids = ids[ids < mask.shape[0] * 32]
    words = mask.view(np.uint32)
    np.bitwise_and.at(words, ids >> 5, ~(np.uint32(1) << (ids & 31).astype(np.uint32)))


def quote_at(data: bytes, escaped: bool) -> int | None:
    """The index of the first ``"`` of ``data`` that closes a JSON string (not escaped), reading
    from inside an escape when ``escaped``; None when there is none."""
    at = data.find(b'"')
    if at < 0:
        return None
    if not escaped and data.find(b"\\", 0, at) < 0:
        return at
    for i, c in enumerate(data):
        if escaped:
            escaped = False
        elif c == BACKSLASH:
            escaped = True
        elif c == QUOTE:
            return i
    return None


def _escape_pending(raw: bytes) -> bool:
    """Whether ``raw`` ends inside a backslash escape's first byte (an odd run of backslashes)."""
    run = len(raw) - len(raw.rstrip(b"\\"))
    return run % 2 == 1


def _next_special(data: bytes, i: int) -> int | None:
    quote, slash = data.find(b'"', i), data.find(b"\\", i)
    found = [x for x in (quote, slash) if x >= 0]
    return min(found) if found else None


def decoded(raw: bytes) -> bytes | None:
    """A whole JSON string's content ``raw`` (no quotes) decoded, as UTF-8 bytes (a lone
    surrogate escape as its surrogatepass bytes); None when it ends inside an escape."""
    text, end = decode_prefix(raw, final=True)
    return text if end == len(raw) else None


def decode_prefix(raw: bytes, final: bool = False) -> tuple[bytes, int]:
    """``(text, end)``: ``raw[:end]`` decoded; ``raw[end:]`` is an escape not yet complete (with
    ``final``, none is awaited: a high surrogate alone is decoded alone). Unknown escapes decode to
    their letter (a grammar for JSON never writes them)."""
    if b"\\" not in raw:
        return raw, len(raw)
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        j = raw.find(b"\\", i)
        if j < 0:
            out += raw[i:]
            break
        out += raw[i:j]
        if j + 1 >= n:
            return bytes(out), j
        if raw[j + 1] != ord("u"):
            out += _SIMPLE_ESCAPES.get(raw[j + 1], raw[j + 1 : j + 2])
            i = j + 2
            continue
        if j + 6 > n:
            return bytes(out), j
        try:
            code = int(raw[j + 2 : j + 6], 16)
        except ValueError:
            out += raw[j : j + 6]
            i = j + 6
            continue
        i = j + 6
        if 0xD800 <= code < 0xDC00:
            rest = raw[i : i + 6]
            if not final and len(rest) < 6 and b"\\u"[: len(rest)] == rest[:2]:
                return bytes(out), j  # its low half may follow
            if len(rest) == 6 and rest[:2] == b"\\u":
                try:
                    low = int(rest[2:], 16)
                except ValueError:
                    low = 0
                if 0xDC00 <= low < 0xE000:
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    i += 6
        out += chr(code).encode("utf-8", "surrogatepass")
    return bytes(out), n
