"""GrammarState: one request's place in its grammar (an llguidance matcher of its own), and the
masks the next-token pass and speculative verification read from it.

- ``mask()``: the tokens allowed next (cached until the state changes);
- ``masks(paths)``: the allowed tokens after each of several token paths (the prefixes of a verify
  window's drafts, or a token tree's node paths), reached by consuming and rolling back, so the
  state is unchanged afterwards; a path the grammar refuses part-way gets an all-allowing mask (its
  position can never be accepted: an earlier draft on it is refused);
- ``valid_prefix(tokens)``: how many drafts the grammar admits in a row;
- ``forced(limit)``: the tokens the grammar admits one at a time, each the only token allowed
  (jump-forward: exactly what token-by-token constrained decoding would choose);
- ``advance(token)``: the state after an accepted token.

A JSON output (``keys``: the model's ``KeyTable`` and the guard's mode) also carries a
``key_guard.KeyScan``: every mask above then leaves out the tokens that would repeat a key in the
object being written, and those after which the grammar can finish the key only as one the object
holds (found by looking ahead with the matcher, at most ``LOOKAHEAD_MASKS`` masks a mask);
``valid_prefix`` stops before a token that closes a repeated key. No path, chosen, drafted or
forced, repeats a key. In ``masks``, a path whose every continuation would repeat a key is
unreachable when the row before it forbids its last token (the lookahead did), and fails the
request otherwise.

The request alone fails when the engine does: ``GrammarLimitError`` (naming the constraint's
``field``) when its constraint goes past what the engine can follow (one step's work over
``parser_limits``, a state that allows no token, or one whose every token would repeat a key);
``GrammarError`` when the engine contradicts itself (it refuses a token it allowed)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GrammarError, GrammarLimitError
from .key_guard import IN_KEY, KeyScan, KeyTable, allows, forbid
from .token_mask import mask_words, only_token

# masks the duplicate-key lookahead may compute for one mask (past them a key prefix counts as one
# that can still become a new key: the request may then meet a state with no token, and fail)
LOOKAHEAD_MASKS = 16


class _KeysExhausted(GrammarLimitError):
    """Every token the grammar allows would repeat a key (``masks`` tells a reachable path from an
    unreachable one)."""


class GrammarState:
    """``matcher``: this request's own llguidance ``LLMatcher`` (a copy of a compiled grammar's)
    over ``vocab_size`` ids; ``eos_token_ids`` end the grammar and are never forced; ``field``:
    the request field of the constraint (named by its errors); ``keys``: the model's key table and
    the guard's mode (``"json"`` or ``"embedded"``, see ``key_guard``) for an output whose JSON
    objects must not repeat a key, None for none."""

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: tuple[int, ...],
                 field: str = "grammar", keys: tuple[KeyTable, str] | None = None) -> None:
        self.matcher = matcher
        self.words = mask_words(vocab_size)
        self.eos = frozenset(eos_token_ids)
        self.field = field
        self.table: KeyTable | None = None if keys is None else keys[0]
        self.scan: KeyScan | None = None if keys is None else KeyScan(keys[1])
        # (scan position, token) pairs known to leave room for a new key (see _forbid_dead_ends)
        self._viable: set[tuple[Any, int]] = set()
        self.consumed = 0  # tokens advanced over
        self._mask: np.ndarray | None = None  # the mask of the current state
        # the last ``forced`` chain and the masks after each of its prefixes (valid until advance):
        # the verify window that appends the chain reads them instead of computing them again
        self._chain: tuple[list[int], list[np.ndarray]] = ([], [])

    @property
    def terminated(self) -> bool:
        """Whether the grammar ended: nothing but EOS may follow (the request then stops)."""
        return bool(self.matcher.is_stopped())

    @property
    def complete(self) -> bool:
        """Whether the output so far is a whole match of the grammar."""
        return bool(self.matcher.is_accepting())

    def _check(self) -> None:
        if self.matcher.is_error():
            message = str(self.matcher.get_error()).replace("<non-verbose/>", "").strip()
            raise GrammarLimitError(f"the grammar engine failed: {message}", field=self.field)

    def _compute(self, out: np.ndarray, scan: KeyScan | None) -> None:
        """The matcher's mask into ``out``, less the tokens that would repeat a key after
        ``scan`` (the guard's state at this point)."""
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._check()
        if not out.any():
            raise GrammarLimitError("the grammar allows no token after the output so far",
                                    field=self.field)
        if scan is not None and self.table is not None:
            ids = scan.forbidden(self.table, out)
            if ids is not None:
                forbid(out, ids)
            self._forbid_dead_ends(out, scan)
            if not out.any():
                raise _KeysExhausted("every token the grammar allows here would repeat a key of "
                                     "the JSON object being written", field=self.field)

    def _forbid_dead_ends(self, out: np.ndarray, scan: KeyScan) -> None:
        """Clear from ``out`` the tokens after which the object being written can take no new
        key (the matcher stands where ``scan`` does); see ``key_guard``."""
        assert self.table is not None
        risky = scan.risky(self.table, out)
        if risky is None:
            return
        budget = [LOOKAHEAD_MASKS]
        held = (len(scan.stack), scan.held(), scan.string == IN_KEY, scan.raw)
        dead = []
        for t in risky.tolist():
            if (held, t) in self._viable:
                continue
            if self._can_finish_new_key(t, scan, budget):
                if scan.string != IN_KEY:  # between members: the same again until a key is added
                    self._viable.add((held, t))
            else:
                dead.append(t)
        if dead:
            forbid(out, np.array(dead, dtype=np.int64))

    def _can_finish_new_key(self, token: int, scan: KeyScan, budget: list[int]) -> bool:
        """Whether after ``token`` (allowed here) the grammar can write a key the object being
        written does not hold: some allowed token does not lead towards a held key (``risky``), or
        one that does leads on to such a token (depth first, within ``budget`` masks; True when
        it runs out)."""
        assert self.table is not None
        if budget[0] <= 0:
            return True
        budget[0] -= 1
        after = scan.advance(self._bytes(token))
        if not self.matcher.consume_tokens([token]):
            return True  # (the engine's error surfaces from the next mask)
        try:
            mask = np.empty(self.words, dtype=np.int32)
            self.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            if self.matcher.is_error():
                return True
            free = mask.copy()
            held, risky = after.forbidden(self.table, mask), after.risky(self.table, mask)
            for ids in (held, risky):
                if ids is not None:
                    forbid(free, ids)
            if free.any():
                return True
            return risky is not None and any(self._can_finish_new_key(t, after, budget)
                                             for t in risky.tolist())
        finally:
            self.matcher.rollback(1)

    def _bytes(self, token: int) -> bytes:
        assert self.table is not None
        words = self.table.token_bytes
        return words[token] if 0 <= token < len(words) else b""

    def mask(self) -> np.ndarray:
        """int32 ``[W]``: the tokens allowed next."""
        if self._mask is None:
            mask = np.empty(self.words, dtype=np.int32)
            self._compute(mask, self.scan)
            self._mask = mask
        return self._mask

    def masks(self, paths: list[list[int]]) -> np.ndarray:
        """int32 ``[len(paths), W]``: row i the tokens allowed after ``paths[i]``. A position no
        output can reach allows every token: after a token the grammar refuses, after an EOS id, or
        after the grammar ended (the request stops there). Paths sharing a prefix reuse its
        consumption (a chain's or a tree's paths in order cost one consume per token); the state is
        restored afterwards."""
        out = np.full((len(paths), self.words), -1, dtype=np.int32)
        stack: list[int] = []  # tokens consumed beyond the current state
        scans: dict[tuple[int, ...], KeyScan] = {}  # the guard's state after a path
        exhausted: list[int] = []  # rows whose every token would repeat a key
        try:
            chain, chain_masks = self._chain
            for i, path in enumerate(paths):
                if len(path) < len(chain_masks) and list(path) == chain[: len(path)]:
                    out[i] = chain_masks[len(path)]  # computed by ``forced``
                    continue
                common = 0
                while common < min(len(stack), len(path)) and stack[common] == path[common]:
                    common += 1
                if common < len(stack):
                    self.matcher.rollback(len(stack) - common)
                    del stack[common:]
                rest = list(path[common:])
                if any(t in self.eos for t in rest):
                    continue  # after an EOS: unreachable
                if rest:
                    ok = self._valid(rest, self._scan_after(stack, scans))
                    if ok:
                        self._consume(rest[:ok])
                        stack.extend(rest[:ok])
                    if ok < len(rest):
                        continue  # refused part-way: unreachable
                if not stack:
                    out[i] = self.mask()
                elif not self.matcher.is_stopped():
                    try:
                        self._compute(out[i], self._scan_after(stack, scans))
                    except _KeysExhausted:
                        exhausted.append(i)
        finally:
            if stack:
                self.matcher.rollback(len(stack))
        rows = {tuple(p): i for i, p in enumerate(paths)}
        for i in exhausted:
            path = list(paths[i])
            before = rows.get(tuple(path[:-1]))
            if before is None or before in exhausted or \
                    not allows(out[before], np.array(path[-1:], dtype=np.int64)).all():
                out[i] = -1  # unreachable: the row before it forbids its last token
            else:
                raise _KeysExhausted("every token the grammar allows here would repeat a key of "
                                     "the JSON object being written", field=self.field)
        return out

    def _scan_after(self, path: list[int], scans: dict[tuple[int, ...], KeyScan]
                    ) -> KeyScan | None:
        """The guard's state after ``path`` from the current state (each prefix's kept in
        ``scans``); None without a guard."""
        if self.scan is None:
            return None
        key = tuple(path)
        if key in scans:
            return scans[key]
        scan = self.scan if not path else self._scan_after(path[:-1], scans)
        assert scan is not None
        if path:
            scan = scan.advance(self._bytes(path[-1]))
        scans[key] = scan
        return scan

    def _consume(self, tokens: list[int]) -> None:
        if not self.matcher.consume_tokens(tokens):
            self._check()
            raise GrammarError(f"the grammar engine refused tokens it validated: {tokens}")

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens``, in order from the current state, the grammar admits (and none
        past one that would repeat a key)."""
        return self._valid(tokens, self.scan)

    def _valid(self, tokens: list[int], scan: KeyScan | None) -> int:
        """``valid_prefix`` from where the matcher stands, the guard at ``scan`` there."""
        valid = int(self.matcher.validate_tokens(tokens)) if tokens else 0
        if scan is None:
            return valid
        for j in range(valid):
            data = self._bytes(tokens[j])
            if scan.repeats_key(data):
                return j
            scan = scan.advance(data)
        return valid

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens, each the only one the grammar allows after those before it (never
        an EOS id, and none after the grammar ended); the state is unchanged afterwards, and the
        masks computed on the way serve ``masks`` until the next ``advance``."""
        out: list[int] = []
        mask = self.mask()
        masks = [mask]  # masks[j]: after out[:j]
        scan = self.scan
        try:
            while len(out) < limit:
                token = only_token(mask)
                if token is None or token in self.eos:
                    break
                self._consume([token])
                out.append(token)
                if scan is not None:
                    scan = scan.advance(self._bytes(token))
                if len(out) < limit and not self.matcher.is_stopped():
                    mask = np.empty(self.words, dtype=np.int32)
                    self._compute(mask, scan)
                    masks.append(mask)
                else:
                    break
        finally:
            if out:
                self.matcher.rollback(len(out))
        self._chain = (out, masks)
        return out

    def advance(self, token: int) -> None:
        """Move past ``token`` (accepted by the request). GrammarError when the grammar refuses
        it or it would repeat a key (no mask allows it), GrammarLimitError when the engine fails
        past a limit taking it."""
        self._mask = None
        self._chain = ([], [])
        data = self._bytes(token) if self.scan is not None else b""
        if self.scan is not None and self.scan.repeats_key(data):
            raise GrammarError(f"token {token} would repeat a key of the JSON object being "
                               "written (the mask forbade it)")
        if not self.matcher.consume_token(token):
            message = str(self.matcher.get_error())
            if "doesn't satisfy the grammar" in message:  # refused, not a limit
                raise GrammarError(f"the grammar refused token {token}: {message}")
            self._check()
            raise GrammarError(f"the grammar refused token {token}")
        if self.scan is not None:
            self.scan = self.scan.advance(data)
        self.consumed += 1

