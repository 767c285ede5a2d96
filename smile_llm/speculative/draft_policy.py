"""Adaptive drafts: a policy chooses each speculative row's ``k``, or a token-tree shape, for every
round (``speculative_tokens="auto"``).

The decoder asks ``choose(seq, budget)`` before a step: a draft count in ``0 .. budget`` (0 is a
plain step) or, for a row whose ``tree_rounds`` is true (its drafter proposes trees and the model
verifies them: dense, one rank), a tree shape: branching factors per depth ``(b_1 .. b_k)`` with
``k <= budget`` (``draft_tree``: the drafter's chain of k drafts and, at depth j, its next
``b_j - 1`` most likely tokens as leaves). It reports what happened:
``observe_round(seqs, k, accepted, draft_s, verify_s)`` after a linear round of k drafts (the drafts
each row kept; the seconds the drafter's ``propose`` and the verify forward took),
``observe_plain(rows, seconds)`` after a plain step and, to a policy that chooses trees,
``observe_tree(seqs, branching, walks, draft_s, verify_s)`` after a tree round (``walks[i]``, a
``TreeWalk``: at each node of row i's accepted path, how many children it offered and which one was
taken; 0 is the drafter's own continuation). The policy hears of rows with
``speculative_tokens="auto"`` only. Any object with the first three methods is a policy
(``DraftPolicy``); one that returns tree shapes needs ``observe_tree`` too. Set it with
``LanguageModel.draft_policy``.

The built-in ``ThroughputPolicy`` maximises expected tokens per second. Per request it keeps running
estimates of the chance that the draft at each position is kept given the ones before it were (so a
round of k drafts adds ``E(k)`` tokens on average); for the model, the chance that the target's
token is the r-th alternative at a depth whose chain draft was rejected, and running least-squares
fits of the verify time against the window length, of the draft time against k, and of the plain
step time. For each k it grows a tree from the chain, one alternative at a time where it adds the
most expected tokens, while that raises the rate, and picks the k (and tree) with the largest
``E / (draft(k) + verify(window))``, 0 (a plain step, one token) when nothing beats it. Alternatives
pay where drafts are often rejected and a verify position is cheap next to a draft step.
"""

from __future__ import annotations

from collections.abc import Sequence

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .draft_tree import MAX_BRANCHING, MAX_TREE_NODES, TreeWalk

if TYPE_CHECKING:
    from .draft_row import DraftRow


@runtime_checkable
class DraftPolicy(Protocol):
    """Chooses each speculative row's draft count per round (see the module docstring)."""

    def choose(self, seq: DraftRow, budget: int) -> int | tuple[int, ...]:
        """Drafts for ``seq``'s next round, in ``0 .. budget`` (0: a plain step), or a token-tree
        shape of at most ``budget`` depths when ``seq.tree_rounds``."""
        ...

    def observe_round(self, seqs: Sequence[DraftRow], k: int, accepted: list[int], draft_s: float,
                      verify_s: float) -> None:
        """A round of ``k`` drafts for ``seqs`` kept ``accepted[i]`` drafts of row i; its drafting
        and verify forward took ``draft_s`` and ``verify_s`` seconds."""
        ...

    def observe_plain(self, seqs: Sequence[DraftRow], seconds: float) -> None:
        """A plain step of ``seqs`` took ``seconds``."""
        ...


class RunningFit:
    """Least squares of ``y ~ a + b * x`` over exponentially decayed observations (an observation's
    weight halves after about ``0.7 / (1 - decay)`` newer ones)."""

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.xs: set[float] = set()

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.w, self.sx, self.sy = d * self.w + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y
        self.xs.add(x)

    def predict(self, x: float, prior_slope: float) -> float:
        """The fitted ``a + b * x`` (b never below 0); until two distinct x were seen, the line of
        slope ``prior_slope`` through their mean. Call only after an ``add``."""
        mean_x, mean_y = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mean_x**2
        if len(self.xs) < 2 or var <= 1e-12:
            return mean_y + prior_slope * (x - mean_x)
        b = max(0.0, (self.sxy / self.w - mean_x * mean_y) / var)
        return mean_y + b * (x - mean_x)


class ThroughputPolicy:
    """The built-in policy: the k of the largest expected tokens per second (see the module
    docstring).

    Per request it counts, for each draft position j, how often a round reached it (the drafts
    before it were kept) and how often its draft was kept too, decayed by ``decay`` per round; the
    conditional acceptance ``a_j`` is their ratio, shrunk (``prior_weight`` rounds) towards the same
    ratio over every request, which is itself shrunk towards the position before
    (``prior_acceptance`` before any round): a new request starts from what the model's drafts have
    been doing. A round of k drafts then adds ``E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k``
    tokens on average."""

    # a row held to plain steps this many times in a row drafts one token, to re-measure
    PROBE_AFTER = 16
    DEPTH = 7  # positions tracked (MAX_SPECULATIVE_TOKENS)

    def __init__(self, prior_acceptance: float = 0.7, prior_weight: float = 2.0,
                 decay: float = 0.95, trees: bool = True, prior_rescue: float = 0.1) -> None:
        self.prior_acceptance, self.prior_weight, self.decay = prior_acceptance, prior_weight, decay
        self.trees = trees  # consider token trees for rows that can take them
        # P(the first alternative is the target's token | chain rejected), unseen
        self.prior_rescue = prior_rescue
        # [depth][rank], decayed per tree round
        self._alt_hit = [[0.0] * MAX_BRANCHING for _ in range(self.DEPTH)]
        self._alt_tried = [[0.0] * MAX_BRANCHING for _ in range(self.DEPTH)]
        self.verify = RunningFit()  # seconds ~ window length
        self.draft = RunningFit()  # seconds ~ k
        self.plain = RunningFit()  # seconds of a plain step (x = 0)
        # request id -> (kept[j], reached[j]), decayed
        self._seen: dict[int, tuple[list[float], list[float]]] = {}
        self._plain_runs: dict[int, int] = {}  # request id -> plain steps chosen in a row
        # every request's counts, decayed per round (a new request's prior)
        self._model_kept = [0.0] * self.DEPTH
        self._model_reached = [0.0] * self.DEPTH

    def acceptances(self, seq: DraftRow) -> list[float]:
        """The running chance that ``seq``'s draft at position j (1..DEPTH) is kept, given the ones
        before were: its own counts, shrunk towards the model's (every request's, decayed) at that
        position, which a new request starts from."""
        kept, reached = self._seen.get(seq.request_id, ([0.0] * self.DEPTH, [0.0] * self.DEPTH))
        out, prev = [], self.prior_acceptance
        for j in range(self.DEPTH):
            # the model's estimate, itself shrunk towards the position before
            if self._model_reached[j] > 0:
                prev = ((self._model_kept[j] + self.prior_weight * prev)
                        / (self._model_reached[j] + self.prior_weight))
            w = self.prior_weight
            own = (kept[j] + w * prev) / (reached[j] + w)
            out.append(min(max(own, 0.0), 0.999))
        return out

    @staticmethod
    def expected_tokens(acceptances: list[float], k: int) -> float:
        """Tokens a round of ``k`` drafts adds on average with conditional acceptances
        ``acceptances``."""
        total, run = 1.0, 1.0
        for a in acceptances[:k]:
            run *= a
            total += run
        return total

    def costs(self) -> tuple[float, list[float]]:
        """The predicted seconds of a plain step and of rounds of k = 1..DEPTH drafts. Before
        anything is measured the plain step is the unit; a verify window then costs 5% more per
        position and each draft 10% of a step."""
        # per position / draft, in plain steps, until measured
        verify_slope, draft_slope = 0.05, 0.1
        if self.plain.w:
            plain = self.plain.predict(0.0, 0.0)
        elif self.verify.w:
            plain = self.verify.predict(1, 0.0) / (1 + verify_slope)
        else:
            plain = 1.0
        plain = max(plain, 1e-9)
        rounds = []
        for k in range(1, self.DEPTH + 1):
            verify = (self.verify.predict(k + 1, verify_slope * plain) if self.verify.w
                      else plain * (1 + 0.05 * k))
            draft = (self.draft.predict(k, draft_slope * plain) if self.draft.w
                     else plain * draft_slope * k)
            rounds.append(max(verify + max(draft, 0.0), 1e-9))
        return plain, rounds

    def rescue(self, depth: int, rank: int) -> float:
        """The chance that the target's token at ``depth`` (0-based) is the ``rank``-th alternative
        (1-based) when the chain's draft there was rejected: every tree round's counts, shrunk
        towards ``prior_rescue * 0.6 ** (rank - 1)``."""
        prior = self.prior_rescue * 0.6 ** (rank - 1)
        w = self.prior_weight
        return (self._alt_hit[depth][rank] + w * prior) / (self._alt_tried[depth][rank] + w)

    def verify_cost(self, window: int, plain: float) -> float:
        """Predicted seconds of a verify window of ``window`` positions."""
        return (self.verify.predict(window, 0.05 * plain) if self.verify.w
                else plain * (1 + 0.05 * (window - 1)))

    def tree_for(self, acceptances: list[float], k: int, plain: float,
                 draft: float) -> tuple[tuple[int, ...], float, float]:
        """The tree of ``k`` depths grown from the chain, one alternative at a time where it adds
        the most expected tokens, while that raises the rate: (branching, expected tokens, predicted
        seconds)."""
        branching = [1] * k
        reach, run = [], 1.0  # P(depth j is reached)
        for a in acceptances[:k]:
            reach.append(run)
            run *= a
        tokens = self.expected_tokens(acceptances, k)
        seconds = draft + self.verify_cost(k + 1, plain)
        nodes = k
        while nodes < MAX_TREE_NODES:
            gains = [reach[j] * (1 - acceptances[j]) * self.rescue(j, branching[j])
                     if branching[j] < MAX_BRANCHING else -1.0 for j in range(k)]
            j = max(range(k), key=gains.__getitem__)
            more = draft + self.verify_cost(nodes + 2, plain)
            if gains[j] <= 0 or (tokens + gains[j]) / more <= tokens / seconds:
                break
            branching[j] += 1
            nodes += 1
            tokens, seconds = tokens + gains[j], more
        return tuple(branching), tokens, seconds

    def choose(self, seq: DraftRow, budget: int) -> int | tuple[int, ...]:
        acceptances = self.acceptances(seq)
        plain, rounds = self.costs()
        best_choice: int | tuple[int, ...] = 0
        best = 1.0 / plain
        trees = self.trees and seq.tree_rounds
        for k in range(1, min(budget, len(rounds)) + 1):
            rate = self.expected_tokens(acceptances, k) / rounds[k - 1]
            if rate > best:
                best_choice, best = k, rate
            if trees:
                draft = rounds[k - 1] - self.verify_cost(k + 1, plain)
                shape, tokens, seconds = self.tree_for(acceptances, k, plain, draft)
                if max(shape) > 1 and tokens / seconds > best:
                    best_choice, best = shape, tokens / seconds
        runs = self._plain_runs.get(seq.request_id, 0)
        if best_choice == 0 and budget >= 1 and runs >= self.PROBE_AFTER:
            best_choice = 1  # re-measure this row's acceptance now and then
        self._plain_runs[seq.request_id] = runs + 1 if best_choice == 0 else 0
        return best_choice

    def observe_tree(self, seqs: Sequence[DraftRow], branching: tuple[int, ...],
                     walks: list[TreeWalk], draft_s: float, verify_s: float) -> None:
        """A tree round: the chain's drafts kept (the leading 0 ranks) as in ``observe_round``, and
        at the depth where the chain's draft was rejected, which of the alternatives offered there
        (if any) the target took."""
        k = len(branching)
        kept = [next((i for i, r in enumerate(w.ranks) if r), len(w.ranks)) for w in walks]
        self._observe(seqs, k, kept)
        self.draft.add(k, draft_s)
        self.verify.add(1 + max((w.nodes for w in walks), default=k), verify_s)
        d = self.decay
        self._alt_hit = [[d * x for x in row] for row in self._alt_hit]
        self._alt_tried = [[d * x for x in row] for row in self._alt_tried]
        for w, n in zip(walks, kept):
            if n >= min(k, len(w.offered)):
                continue  # the whole chain kept, or nothing offered where it stopped
            hit = w.ranks[n] if n < len(w.ranks) else 0  # 0: no alternative held the target's token
            for rank in range(1, min(w.offered[n], MAX_BRANCHING)):
                self._alt_tried[n][rank] += 1
                if rank == hit:
                    self._alt_hit[n][rank] += 1

    def observe_round(self, seqs: Sequence[DraftRow], k: int, accepted: list[int], draft_s: float,
                      verify_s: float) -> None:
        self.draft.add(k, draft_s)
        self.verify.add(k + 1, verify_s)
        self._observe(seqs, k, accepted)

    def _observe(self, seqs: Sequence[DraftRow], k: int, accepted: list[int]) -> None:
        """Each row's chain of ``k`` drafts kept its first ``accepted[i]``: the acceptance
        counts."""
        d = self.decay
        # the model's counts: decayed once per round
        self._model_kept = [d * x for x in self._model_kept]
        self._model_reached = [d * x for x in self._model_reached]
        for seq, n in zip(seqs, accepted):
            kept, reached = self._seen.get(seq.request_id, ([0.0] * self.DEPTH, [0.0] * self.DEPTH))
            kept = [d * x for x in kept]
            reached = [d * x for x in reached]
            # positions 0..n reached (n kept, then the first rejected one)
            for j in range(min(n + 1, k)):
                reached[j] += 1
                self._model_reached[j] += 1
                if j < n:
                    kept[j] += 1
                    self._model_kept[j] += 1
            self._seen[seq.request_id] = (kept, reached)

    def observe_plain(self, seqs: Sequence[DraftRow], seconds: float) -> None:
        self.plain.add(0.0, seconds)

    def forget(self, seq: DraftRow) -> None:
        """Drop ``seq``'s estimates (the request ended)."""
        self._seen.pop(seq.request_id, None)
        self._plain_runs.pop(seq.request_id, None)
