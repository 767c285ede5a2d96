"""DraftRow: what drafters and draft policies read of a request being generated.

The serving layer's ``RequestRow`` is one; drafters never see more of it than this, so speculation
does not depend on the request path above it. A drafter keeps its per-request state in ``history``
(set by its ``bind``, cleared by its ``release``). Positions: the prompt occupies
``[0, len(prompt))``, generated token i sits at ``len(prompt) + i``."""

from __future__ import annotations

from typing import Any, Protocol

from ..sampling.sampler import PositionalRng


class DraftRow(Protocol):
    # the row's id in the target model's pool (the drafter keys its own state by it)
    request_id: int
    prompt: list[int]
    tokens: list[int]  # generated so far
    matched: int  # prompt positions found in the target's prefix cache
    prefilled: int  # prompt positions whose target KV is written
    capacity: int  # positions bound in the target pool
    temperature: float
    top_p: float
    draft_sampling: str  # "greedy" or "sample"
    rng: PositionalRng  # the row's positional randomness (drafts draw from its DRAFT stream)
    tree_rounds: bool  # whether a round may be a token tree
    history: Any  # the drafter's state for this row (its own type; None while unbound)

    @property
    def last_pos(self) -> int:
        """Position of the last token (the next target forward writes its KV)."""
        ...

    def tokens_between(self, start: int, end: int) -> list[int]:
        """Tokens at positions ``[start, end)``."""
        ...
