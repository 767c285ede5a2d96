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

GrammarError when the engine fails (a state with no allowed token, an internal limit): the request
alone fails with it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GrammarError
from .token_mask import mask_words, only_token


class GrammarState:
    """``matcher``: this request's own llguidance ``LLMatcher`` (a copy of a compiled grammar's)
    over ``vocab_size`` ids; ``eos_token_ids`` end the grammar and are never forced."""

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.matcher = matcher
        self.words = mask_words(vocab_size)
        self.eos = frozenset(eos_token_ids)
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
            raise GrammarError(f"the grammar engine failed: {message}")

    def _compute(self, out: np.ndarray) -> None:
        self.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        self._check()
        if not out.any():
            raise GrammarError("the grammar allows no token after the output so far")

    def mask(self) -> np.ndarray:
        """int32 ``[W]``: the tokens allowed next."""
        if self._mask is None:
            mask = np.empty(self.words, dtype=np.int32)
            self._compute(mask)
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
                    ok = self.valid_prefix(rest)
                    if ok:
                        self._consume(rest[:ok])
                        stack.extend(rest[:ok])
                    if ok < len(rest):
                        continue  # refused part-way: unreachable
                if not stack:
                    out[i] = self.mask()
                elif not self.matcher.is_stopped():
                    self._compute(out[i])
        finally:
            if stack:
                self.matcher.rollback(len(stack))
        return out

    def _consume(self, tokens: list[int]) -> None:
        if not self.matcher.consume_tokens(tokens):
            self._check()
            raise GrammarError(f"the grammar engine refused tokens it validated: {tokens}")

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens``, in order from the current state, the grammar admits."""
        return int(self.matcher.validate_tokens(tokens)) if tokens else 0

    def forced(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens, each the only one the grammar allows after those before it (never
        an EOS id, and none after the grammar ended); the state is unchanged afterwards, and the
        masks computed on the way serve ``masks`` until the next ``advance``."""
        out: list[int] = []
        mask = self.mask()
        masks = [mask]  # masks[j]: after out[:j]
        try:
            while len(out) < limit:
                token = only_token(mask)
                if token is None or token in self.eos:
                    break
                self._consume([token])
                out.append(token)
                if len(out) < limit and not self.matcher.is_stopped():
                    mask = np.empty(self.words, dtype=np.int32)
                    self._compute(mask)
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
        it."""
        self._mask = None
        self._chain = ([], [])
        if not self.matcher.consume_token(token):
            self._check()
            raise GrammarError(f"the grammar refused token {token}")
        self.consumed += 1
