"""Adaptive draft counts: a policy chooses each speculative row's ``k`` for every round (``speculative_tokens="auto"``).

The decoder asks ``choose(seq, budget)`` before a step (``0 .. budget``; 0 is a plain step), and reports what
happened: ``observe_round(seqs, k, accepted, draft_s, verify_s)`` after a speculative round of k drafts (the drafts
each row kept; the seconds the drafter's ``propose`` and the verify forward took) and ``observe_plain(rows,
seconds)`` after a plain step. Any object with these three methods is a policy (``DraftPolicy``); set it with
``LanguageModel.draft_policy``.

The built-in ``ThroughputPolicy`` maximises expected tokens per second. Per request it keeps running estimates of
the chance that the draft at each position is kept given the ones before it were (so a round of k drafts adds
``E(k)`` tokens on average); for the model it keeps running least-squares fits of the verify time against the window
length, of the draft time against k, and of the plain step time. It picks the k with the largest
``E(k) / (draft(k) + verify(k + 1))``, 0 (a plain step, one token) when nothing beats it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .sequence import Sequence


@runtime_checkable
class DraftPolicy(Protocol):
    """Chooses each speculative row's draft count per round (see the module docstring)."""

    def choose(self, seq: Sequence, budget: int) -> int:
        """Drafts for ``seq``'s next round, in ``0 .. budget`` (0: a plain step)."""
        ...

    def observe_round(self, seqs: list[Sequence], k: int, accepted: list[int], draft_s: float,
                      verify_s: float) -> None:
        """A round of ``k`` drafts for ``seqs`` kept ``accepted[i]`` drafts of row i; its drafting and verify
        forward took ``draft_s`` and ``verify_s`` seconds."""
        ...

    def observe_plain(self, seqs: list[Sequence], seconds: float) -> None:
        """A plain step of ``seqs`` took ``seconds``."""
        ...


class RunningFit:
    """Least squares of ``y ~ a + b * x`` over exponentially decayed observations (an observation's weight halves
    after about ``0.7 / (1 - decay)`` newer ones)."""

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
        """The fitted ``a + b * x`` (b never below 0); until two distinct x were seen, the line of slope
        ``prior_slope`` through their mean. Call only after an ``add``."""
        mean_x, mean_y = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mean_x**2
        if len(self.xs) < 2 or var <= 1e-12:
            return mean_y + prior_slope * (x - mean_x)
        b = max(0.0, (self.sxy / self.w - mean_x * mean_y) / var)
        return mean_y + b * (x - mean_x)


class ThroughputPolicy:
    """The built-in policy: the k of the largest expected tokens per second (see the module docstring).

    Per request it counts, for each draft position j, how often a round reached it (the drafts before it were kept)
    and how often its draft was kept too, decayed by ``decay`` per round; the conditional acceptance ``a_j`` is
    their ratio, shrunk (``prior_weight`` rounds) towards the same ratio over every request, which is itself
    shrunk towards the position before (``prior_acceptance`` before any round): a new request starts from what
    the model's drafts have been doing. A round of k drafts then adds ``E(k) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_k`` tokens
    on average."""

    PROBE_AFTER = 16  # a row held to plain steps this many times in a row drafts one token, to re-measure
    DEPTH = 7  # positions tracked (MAX_SPECULATIVE_TOKENS)

    def __init__(self, prior_acceptance: float = 0.7, prior_weight: float = 2.0, decay: float = 0.95) -> None:
        self.prior_acceptance, self.prior_weight, self.decay = prior_acceptance, prior_weight, decay
        self.verify = RunningFit()  # seconds ~ window length
        self.draft = RunningFit()  # seconds ~ k
        self.plain = RunningFit()  # seconds of a plain step (x = 0)
        self._seen: dict[int, tuple[list[float], list[float]]] = {}  # request id -> (kept[j], reached[j]), decayed
        self._plain_runs: dict[int, int] = {}  # request id -> plain steps chosen in a row
        self._model_kept = [0.0] * self.DEPTH  # every request's counts, decayed per round (a new request's prior)
        self._model_reached = [0.0] * self.DEPTH

    def acceptances(self, seq: Sequence) -> list[float]:
        """The running chance that ``seq``'s draft at position j (1..DEPTH) is kept, given the ones before were: its
        own counts, shrunk towards the model's (every request's, decayed) at that position, which a new request
        starts from."""
        kept, reached = self._seen.get(seq.request_id, ([0.0] * self.DEPTH, [0.0] * self.DEPTH))
        out, prev = [], self.prior_acceptance
        for j in range(self.DEPTH):
            if self._model_reached[j] > 0:  # the model's estimate, itself shrunk towards the position before
                prev = (self._model_kept[j] + self.prior_weight * prev) / (self._model_reached[j] + self.prior_weight)
            w = self.prior_weight
            own = (kept[j] + w * prev) / (reached[j] + w)
            out.append(min(max(own, 0.0), 0.999))
        return out

    @staticmethod
    def expected_tokens(acceptances: list[float], k: int) -> float:
        """Tokens a round of ``k`` drafts adds on average with conditional acceptances ``acceptances``."""
        total, run = 1.0, 1.0
        for a in acceptances[:k]:
            run *= a
            total += run
        return total

    def costs(self) -> tuple[float, list[float]]:
        """The predicted seconds of a plain step and of rounds of k = 1..DEPTH drafts. Before anything is measured
        the plain step is the unit; a verify window then costs 5% more per position and each draft 10% of a step."""
        verify_slope, draft_slope = 0.05, 0.1  # per position / draft, in plain steps, until measured
        if self.plain.w:
            plain = self.plain.predict(0.0, 0.0)
        elif self.verify.w:
            plain = self.verify.predict(1, 0.0) / (1 + verify_slope)
        else:
            plain = 1.0
        plain = max(plain, 1e-9)
        rounds = []
        for k in range(1, self.DEPTH + 1):
            verify = self.verify.predict(k + 1, verify_slope * plain) if self.verify.w else plain * (1 + 0.05 * k)
            draft = self.draft.predict(k, draft_slope * plain) if self.draft.w else plain * draft_slope * k
            rounds.append(max(verify + max(draft, 0.0), 1e-9))
        return plain, rounds

    def choose(self, seq: Sequence, budget: int) -> int:
        acceptances = self.acceptances(seq)
        plain, rounds = self.costs()
        best_k, best = 0, 1.0 / plain
        for k in range(1, min(budget, len(rounds)) + 1):
            rate = self.expected_tokens(acceptances, k) / rounds[k - 1]
            if rate > best:
                best_k, best = k, rate
        runs = self._plain_runs.get(seq.request_id, 0)
        if best_k == 0 and budget >= 1 and runs >= self.PROBE_AFTER:
            best_k = 1  # re-measure this row's acceptance now and then
        self._plain_runs[seq.request_id] = runs + 1 if best_k == 0 else 0
        return best_k

    def observe_round(self, seqs: list[Sequence], k: int, accepted: list[int], draft_s: float,
                      verify_s: float) -> None:
        self.draft.add(k, draft_s)
        self.verify.add(k + 1, verify_s)
        d = self.decay
        for seq, n in zip(seqs, accepted):
            kept, reached = self._seen.get(seq.request_id, ([0.0] * self.DEPTH, [0.0] * self.DEPTH))
            kept = [d * x for x in kept]
            reached = [d * x for x in reached]
            self._model_kept = [d * x for x in self._model_kept]
            self._model_reached = [d * x for x in self._model_reached]
            for j in range(min(n + 1, k)):  # positions 0..n reached (n kept, then the first rejected one)
                reached[j] += 1
                self._model_reached[j] += 1
                if j < n:
                    kept[j] += 1
                    self._model_kept[j] += 1
            self._seen[seq.request_id] = (kept, reached)

    def observe_plain(self, seqs: list[Sequence], seconds: float) -> None:
        self.plain.add(0.0, seconds)

    def forget(self, seq: Sequence) -> None:
        """Drop ``seq``'s estimates (the request ended)."""
        self._seen.pop(seq.request_id, None)
        self._plain_runs.pop(seq.request_id, None)
