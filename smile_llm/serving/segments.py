"""Registered segments: a token segment (a document, a tool description) whose KV is computed once,
at position 0, kept in the model's pool, and spliced into any request that names it
(``docs/segments.md``).

- ``SegmentRegistry.register`` binds the segment's tokens like a prompt, runs the forward, and
  caches its whole pages in the prefix tree with ``cache_prefix``. The binding stays: it locks the
  tree pages (never evicted while registered) and holds the partial last page privately.
  ``release`` unbinds it. Both run between the serving loop's steps.
- ``lay_out`` turns a request's ``segments`` (pieces: text, token ids, or ``Segment`` handles) into
  prompt tokens and ``Splice`` records: each segment starts at the next page boundary (the tokens
  before it padded with ``pad_id``), and the request's own prompt follows the last piece.
- ``splice`` runs while the request prefills, when it reaches a segment's offset ``M``: the
  segment's KV is written into the request's private pages (``KvCachePool.splice_kv``, keys turned
  by the model's RoPE delta for ``M``, ``models/rope_delta.py``). At ``M = 0`` the bind has already
  matched the segment's whole pages in the tree, shared with no copy; only its partial last page is
  copied, unturned.

A spliced segment never attended to what precedes it, so a request with a shifted segment caches in
the prefix tree only what precedes its first shifted segment (``exact_len``): the tree keeps exact
KV only. Registration, release and splices run on the thread that holds the serving loop's step lock
(they move the pool's pages and run forwards); checking a handle is safe from any thread.
"""

from __future__ import annotations

import itertools
import numbers
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from ..attention.backend import AttentionBackend
from ..cache import KvCachePool
from ..errors import RequestTypeError, SegmentError, SegmentUnsupportedError
from ..models.rope_delta import KeyRotation
from ..models.transformer import Transformer

PIECE_KINDS = "a str, a sequence of int token ids, or a Segment"


@dataclass(frozen=True, eq=False)
class Segment:
    """A segment registered with one model (``LanguageModel.register_segment``): ``segment_id``
    (positive, never reused by that model), its ``tokens``, and ``binding``, the pool request id
    whose binding holds its KV at positions ``[0, len(tokens))``. Compared by identity; pass it in
    a request's ``segments`` and to ``release_segment``."""

    segment_id: int
    tokens: tuple[int, ...]
    binding: int
    owner: object = field(repr=False)  # the registry that made it

    @property
    def length(self) -> int:
        """Tokens of the segment."""
        return len(self.tokens)

    def __repr__(self) -> str:
        return (f"Segment(segment_id={self.segment_id}, length={self.length}, "
                f"binding={self.binding})")


@dataclass(frozen=True)
class Splice:
    """``segment`` placed at positions ``[offset, offset + segment.length)`` of a prompt
    (``offset`` a multiple of the pool's page size)."""

    offset: int
    segment: Segment

    @property
    def end(self) -> int:
        """The position after the segment's last token."""
        return self.offset + self.segment.length


@dataclass(frozen=True)
class SegmentLayout:
    """``lay_out``'s result: the prompt tokens the pieces make (padding included) and where each
    segment sits."""

    tokens: list[int]
    splices: tuple[Splice, ...]


class SplicingRow(Protocol):
    """What ``SegmentRegistry.splice`` reads and moves of a prefilling row (the serving layer's
    ``RequestRow``)."""

    request_id: int
    prefilled: int  # prompt positions whose KV is written
    splices: list[Splice]  # pending, in prompt order
    exact_len: int | None  # the first position whose KV a shifted splice wrote (None: none yet)
    spliced_tokens: int


def check_pieces(value: Any, name: str = "segments") -> tuple[Any, ...] | None:
    """``value`` (a request's ``segments``) as a tuple of pieces: a ``Segment``, a str, or a tuple
    of token ids (a flat sequence of ints >= 0, a 1-D integer array or tensor); None or an empty
    list is None. RequestTypeError naming ``name`` or the piece otherwise (a lone str is refused:
    it would be one piece per character)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Segment)) or not isinstance(value, (list, tuple)):
        raise RequestTypeError(f"{name} must be a list of pieces ({PIECE_KINDS} each), got "
                               f"{type(value).__name__}; for one piece give [piece]", field=name)
    pieces: list[Any] = []
    for i, piece in enumerate(value):
        if isinstance(piece, (Segment, str)):
            pieces.append(piece)
            continue
        if isinstance(piece, (torch.Tensor, np.ndarray)) and piece.ndim == 1:
            piece = piece.tolist()
        if not isinstance(piece, (list, tuple)) or not all(
                isinstance(t, numbers.Integral) and not isinstance(t, bool) and int(t) >= 0
                for t in piece):
            raise RequestTypeError(f"{name}[{i}] must be {PIECE_KINDS}, got "
                                   f"{type(piece).__name__} {str(piece)[:40]}", field=name)
        pieces.append(tuple(int(t) for t in piece))
    return tuple(pieces) or None


def pad_token(encode: Callable[[str], list[int]], eos_token_ids: Iterable[int]) -> int:
    """The token that pads the text before a segment to a page boundary: a single space when it
    encodes to one token, else the first EOS id (0 without one)."""
    ids = encode(" ")
    if len(ids) == 1:
        return int(ids[0])
    return next(iter(eos_token_ids), 0)


class SegmentRegistry:
    """The segments registered with one model: their handles, the forward that computes their KV,
    and the splices that place them (see the module docstring). ``chunk``: the most positions one
    registration forward computes."""

    def __init__(self, transformer: Transformer, pool: KvCachePool, backend: AttentionBackend,
                 chunk: int) -> None:
        self.transformer, self.pool, self.backend, self.chunk = transformer, pool, backend, chunk
        # guarded by _lock: requests are validated on any thread
        self._live: dict[int, Segment] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._rotation: KeyRotation | None = None

    @property
    def rotation(self) -> KeyRotation:
        """The model's RoPE delta turn of stored keys (built on first use)."""
        if self._rotation is None:
            c = self.transformer.config
            self._rotation = KeyRotation(self.transformer.get_buffer("inv_freq"), c.head_dim)
        return self._rotation

    def unsupported(self) -> str | None:
        """Why this model cannot splice segments (None: it can)."""
        if self.pool.state_pools:
            return ("a hybrid model's Gated DeltaNet layers carry a recurrent state through every "
                    "earlier token: moving a segment's KV does not give the state after it, and "
                    "computing that state would mean running the segment again")
        if self.pool.packed:
            return ("the pool stores some layer in a packed low-bit format (kv_dtype), whose pages "
                    "are quantized a whole window at a time; splices write dense storage only")
        if self.transformer.leader is not None:
            return ("with tensor or pipeline parallelism every rank's pool would have to splice "
                    "its own heads or layers in lockstep, which is not implemented")
        return None

    def _require_support(self) -> None:
        reason = self.unsupported()
        if reason is not None:
            raise SegmentUnsupportedError(f"segments are not supported by this model: {reason}",
                                          field="segments")

    @property
    def live(self) -> tuple[Segment, ...]:
        """The registered segments, in registration order."""
        with self._lock:
            return tuple(self._live.values())

    # ------------------------------------------------------------------ register and release
    def register(self, tokens: list[int]) -> Segment:
        """Compute the KV of ``tokens`` (checked ids, at least one) at positions ``[0, N)`` and keep
        it: one binding of capacity ``N`` (KvCacheExhaustedError, nothing bound, when the pool has
        no room), a forward over what the prefix tree does not already hold, then ``cache_prefix``
        (its whole pages join the tree, locked by the binding). Call between steps. A forward that
        raises unbinds it again. SegmentUnsupportedError for a model that cannot splice
        (``unsupported``)."""
        self._require_support()
        pool, n = self.pool, len(tokens)
        rid = pool.bind_request(tokens, n)
        try:
            start = pool.matched_prefix_len(rid)
            while start < n:
                stop = min(n, start + self.chunk)
                pool.activate_step(rid)
                x = torch.tensor([tokens[start:stop]], dtype=torch.int64, device=pool.device)
                self.transformer(x, np.array([start], dtype=np.int64), pool, self.backend,
                                 logit_cols=np.array([stop - start - 1], dtype=np.int64))
                start = stop
            pool.cache_prefix(rid, tokens)
        except BaseException:
            pool.unbind_request(rid)
            raise
        segment = Segment(next(self._ids), tuple(tokens), rid, self)
        with self._lock:
            self._live[segment.segment_id] = segment
        return segment

    def check(self, segment: Any, name: str = "segment", field: str | None = None) -> Segment:
        """``segment`` if it is registered here and its binding is intact; SegmentError naming
        ``name`` in its message and ``field`` (default ``name``) as its field otherwise (not a
        Segment, another model's, released, or its binding unbound by ``unbind_requests`` or an
        exclusive bind on the pool)."""
        field = name if field is None else field
        if not isinstance(segment, Segment):
            raise SegmentError(f"{name} must be a Segment from register_segment, got "
                               f"{type(segment).__name__}", field=field)
        if segment.owner is not self:
            raise SegmentError(f"{name}: segment {segment.segment_id} was registered with another "
                               f"model; register it with this one", field=field)
        with self._lock:
            live = self._live.get(segment.segment_id) is segment
        if not live:
            raise SegmentError(f"{name}: segment {segment.segment_id} was released; register it "
                               f"again", field=field)
        if not self.pool.is_bound(segment.binding):
            raise SegmentError(f"{name}: segment {segment.segment_id} lost its KV (its binding "
                               f"{segment.binding} was unbound directly in the pool); release it "
                               f"and register it again", field=field)
        return segment

    def release(self, segment: Any) -> bool:
        """Unbind ``segment``'s binding (its tree pages become evictable, its private page free);
        True when it was registered, False when already released. Call between steps. SegmentError
        for anything but a Segment of this model. A request still waiting to splice it fails with
        SegmentError."""
        if not isinstance(segment, Segment) or segment.owner is not self:
            self.check(segment)  # raises, naming what it is
        with self._lock:
            if self._live.pop(segment.segment_id, None) is None:
                return False
        if not self.pool.closed:
            self.pool.unbind_request(segment.binding)
        return True

    # ------------------------------------------------------------------ requests
    def lay_out(self, pieces: tuple[Any, ...], encode: Callable[[str], list[int]],
                token_ids: Callable[[Any, str], list[int]], pad_id: int) -> SegmentLayout:
        """The prompt tokens ``pieces`` make, in order: text through ``encode``, ids through
        ``token_ids`` (the vocabulary check), and each ``Segment`` at the next multiple of the
        pool's page size, the tokens before it padded with ``pad_id`` (nothing is padded at 0 or at
        a boundary). SegmentError for a segment this model cannot use; SegmentUnsupportedError for a
        model that cannot splice."""
        self._require_support()
        ps = self.pool.page_size
        tokens: list[int] = []
        splices: list[Splice] = []
        for i, piece in enumerate(pieces):
            if isinstance(piece, Segment):
                self.check(piece, f"segments[{i}]")
                tokens += [pad_id] * (-len(tokens) % ps)
                splices.append(Splice(len(tokens), piece))
                tokens += piece.tokens
            elif isinstance(piece, str):
                tokens += token_ids(encode(piece), f"segments[{i}]") if piece else []
            else:
                tokens += token_ids(list(piece), f"segments[{i}]")
        return SegmentLayout(tokens, tuple(splices))

    def splice(self, row: SplicingRow) -> int:
        """Write the KV of ``row``'s next pending splice, which starts at or before
        ``row.prefilled`` (a prefix hit may already cover its first pages): positions
        ``[prefilled, end)`` through ``KvCachePool.splice_kv``, keys turned by the RoPE delta of its
        offset. Moves ``prefilled`` to its end and, for a shifted segment, sets ``exact_len``;
        returns the tokens written.
        SegmentError when the segment was released since the request was made."""
        sp = row.splices.pop(0)
        segment = self.check(sp.segment, f"the segment at position {sp.offset}", "segments")
        skip = row.prefilled - sp.offset
        assert 0 <= skip < segment.length, "a splice that is not due"
        written = self.pool.splice_kv(row.request_id, row.prefilled, segment.binding, skip,
                                      segment.length - skip,
                                      self.rotation if sp.offset else None)
        if sp.offset and row.exact_len is None:
            row.exact_len = row.prefilled
        row.prefilled = sp.end
        row.spliced_tokens += written
        return written
