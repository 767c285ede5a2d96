"""Per-round traces: what each speculative round of a configuration drafted and kept, summed over
its runs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..speculative.acceptance import RoundRecord


def round_depth(record: RoundRecord) -> int:
    """Drafts on the longest root-to-leaf path: ``len(drafts)`` for a linear round; for a token-tree
    round (its ``parents`` give each draft's parent, 0 the root, 1-based draft numbers otherwise)
    the tree's depth."""
    parents = getattr(record, "parents", None)
    if parents is None:
        return len(record.drafts)
    depth = [0] * (len(parents) + 1)
    for i, parent in enumerate(parents, 1):
        depth[i] = depth[parent] + 1
    return max(depth)


@dataclass
class RoundTally:
    """Counts over ``RoundRecord``s (one ``add`` per round, from
    ``generate(..., on_round=tally.add)``).

    ``reached[j]`` (j = 1..max k) counts rounds whose drafts reach depth j (``round_depth``: the
    draft count of a linear round) and that accepted the j - 1 drafts before depth j;
    ``accepted[j]`` those that also accepted one at depth j. ``drafts`` counts every proposed token
    (a tree's nodes). So ``accepted`` never increases with j, and
    ``acceptance_by_position()[j - 1] = accepted[j] / reached[j]`` is P(draft j accepted | drafts
    before it accepted)."""

    rounds: int = 0
    drafts: int = 0
    accepted_drafts: int = 0
    reached: Counter[int] = field(default_factory=Counter)
    accepted: Counter[int] = field(default_factory=Counter)
    # tokens per round (accepted + 1) -> rounds
    accept_lengths: Counter[int] = field(default_factory=Counter)
    ks: Counter[int] = field(default_factory=Counter)  # depth (drafts of a linear round) -> rounds

    def add(self, record: RoundRecord) -> None:
        """Count one round."""
        k, r = round_depth(record), record.num_accepted
        assert 0 <= r <= k, f"a round accepted {r} of {k} drafts"
        self.rounds += 1
        self.drafts += len(record.drafts)
        self.accepted_drafts += r
        self.accept_lengths[r + 1] += 1
        self.ks[k] += 1
        for j in range(1, min(r + 1, k) + 1):
            self.reached[j] += 1
        for j in range(1, r + 1):
            self.accepted[j] += 1

    def merge(self, other: RoundTally) -> None:
        """Add ``other``'s counts to these."""
        self.rounds += other.rounds
        self.drafts += other.drafts
        self.accepted_drafts += other.accepted_drafts
        for mine, theirs in ((self.reached, other.reached), (self.accepted, other.accepted),
                             (self.accept_lengths, other.accept_lengths), (self.ks, other.ks)):
            mine.update(theirs)

    @property
    def max_k(self) -> int:
        """The deepest round's depth (the most drafts of a linear round; 0 without rounds)."""
        return max(self.ks, default=0)

    @property
    def mean_accepted(self) -> float:
        """Accepted drafts per round (0.0 without rounds)."""
        return self.accepted_drafts / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens a round adds: accepted drafts plus the bonus, ``1 + mean_accepted`` (0.0 without
        rounds)."""
        return 1.0 + self.mean_accepted if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over proposed drafts (0.0 without drafts)."""
        return self.accepted_drafts / self.drafts if self.drafts else 0.0

    def acceptance_by_position(self) -> list[float | None]:
        """P(draft j accepted | drafts 1..j-1 accepted) for j = 1..max_k; None where no round
        reached j."""
        return [self.accepted[j] / self.reached[j] if self.reached[j] else None
                for j in range(1, self.max_k + 1)]

    def summary(self) -> dict[str, Any]:
        """JSON-ready counts and rates."""
        return {"rounds": self.rounds, "drafts": self.drafts,
                "accepted_drafts": self.accepted_drafts, "tokens_per_round": self.tokens_per_round,
                "acceptance_rate": self.acceptance_rate,
                "acceptance_by_position": self.acceptance_by_position(),
                "reached_by_position": [self.reached[j] for j in range(1, self.max_k + 1)],
                "accepted_by_position": [self.accepted[j] for j in range(1, self.max_k + 1)],
                "accept_length_histogram": dict(sorted(self.accept_lengths.items())),
                "depth_histogram": dict(sorted(self.ks.items()))}
