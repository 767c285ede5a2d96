"""What a lab run compares: its frozen ``LabConfig`` and the ``Configuration``s (drafter x draft
settings) it expands into, with the parsers of the command line's ``--k``, ``--drafters``,
``--trees`` and ``--policy``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..models.checkpoint.config import MAX_SPECULATIVE_TOKENS
from ..serving.request import SamplingParams
from .errors import LabError

# drafter names the lab maps to from_pretrained arguments itself; every other name goes to
# build_drafter as is
DRAFTER_VARIANTS: dict[str, dict[str, Any]] = {
    "mtp": {"drafter": "mtp", "draft_kv": "history"},
    "mtp-per-round": {"drafter": "mtp", "draft_kv": "per_round"},
}


def drafter_load_kwargs(name: str) -> dict[str, Any]:
    """``from_pretrained`` arguments for a lab drafter name: ``mtp`` (history draft KV),
    ``mtp-per-round`` (``draft_kv="per_round"``), anything else passed as ``drafter=name``
    (``build_drafter`` validates it)."""
    return dict(DRAFTER_VARIANTS.get(name, {"drafter": name}))


@dataclass(frozen=True)
class Configuration:
    """One thing the lab measures: ``drafter`` (a lab drafter name) with ``speculative_tokens`` (an
    int k, or a policy name such as "auto") and extra ``generate`` keyword arguments
    (``generate_kwargs``, e.g. ``{"draft_tree": (3, 2, 1)}``). The extra arguments must change only
    how drafts are made, never the target's distribution: the lossless check compares the
    configuration with plain decoding of the same prompt."""

    label: str
    drafter: str
    speculative_tokens: int | str
    generate_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def k(self) -> int | None:
        """The fixed draft count, or None for a policy."""
        return self.speculative_tokens if isinstance(self.speculative_tokens, int) else None


@dataclass(frozen=True)
class LabConfig:
    """A lab run. ``model``: a checkpoint folder, or None for the shipped model of ``kind``
    ("dense", "hybrid"). ``drafters`` x ``ks``, then each drafter x ``trees`` (branching factors per
    depth) and x ``policy`` (an adaptive ``speculative_tokens`` value), then ``extra``
    configurations, in that order. ``workload``: a shipped workload's name or a JSONL path.
    ``new_tokens`` per prompt unless the workload says otherwise; ``repeats`` timed runs (medians);
    ``temperature`` 0 checks greedy outputs token for token, > 0 runs the distribution test:
    ``samples`` draws of the first ``sample_tokens`` tokens of each of the first ``sample_prompts``
    prompts, plain and speculative, with different seeds (``seed`` the base). ``prefix_reuse`` False
    (default): every run prefills its whole prompt, so repeats and drafters see the same context.
    ``threads``: torch threads."""

    drafters: tuple[str, ...] = ("mtp",)
    ks: tuple[int, ...] = (1, 2, 3)
    workload: str = "code"
    model: str | None = None
    kind: str = "dense"
    trees: tuple[tuple[int, ...], ...] = ()
    policy: str | None = None
    extra: tuple[Configuration, ...] = ()
    new_tokens: int = 128
    repeats: int = 3
    temperature: float = 0.0
    samples: int = 200
    sample_prompts: int = 3
    sample_tokens: int = 3
    seed: int = 1234
    threads: int = 1
    prefix_reuse: bool = False

    def __post_init__(self) -> None:
        if not self.drafters and not self.extra:
            raise LabError("give at least one drafter")
        for name in ("new_tokens", "repeats", "samples", "sample_prompts", "sample_tokens",
                     "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LabError(f"{name} must be an int >= 1, got {value!r}")
        if not self.temperature >= 0:
            raise LabError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.kind not in ("dense", "hybrid"):
            raise LabError(f'kind must be "dense" or "hybrid", got {self.kind!r}')
        for k in self.ks:
            _check_k(k)
        for tree in self.trees:
            _check_tree(tree)

    def configurations(self) -> list[Configuration]:
        """Every configuration this run measures. LabError when trees or a policy are asked for and
        this build's ``SamplingParams`` does not take them."""
        if self.trees and not trees_supported():
            raise LabError("tree drafts are not available in this build (SamplingParams has no "
                           "draft_tree field)")
        if self.policy is not None and not policy_supported(self.policy):
            if policy_supported("auto"):
                raise LabError(f"policy {self.policy!r} is refused: {_policy_error(self.policy)}")
            raise LabError("adaptive k is not available in this build: "
                           f"speculative_tokens={self.policy!r} is refused by SamplingParams")
        out = [Configuration(f"{d} k={k}", d, k) for d in self.drafters for k in self.ks]
        out += [Configuration(f"{d} tree={','.join(map(str, t))}", d, len(t), {"draft_tree": t})
                for d in self.drafters for t in self.trees]
        if self.policy is not None:
            out += [Configuration(f"{d} k={self.policy}", d, self.policy) for d in self.drafters]
        out += list(self.extra)
        labels = [c.label for c in out]
        if len(set(labels)) != len(labels):
            raise LabError(f"configuration labels repeat: {labels}")
        return out


def trees_supported() -> bool:
    """Whether requests take a token-tree shape (``SamplingParams.draft_tree``)."""
    return "draft_tree" in {f.name for f in dataclasses.fields(SamplingParams)}


def _policy_error(policy: str) -> str:
    """Why ``SamplingParams(speculative_tokens=policy)`` is refused, or "" when it is accepted."""
    try:
        SamplingParams(speculative_tokens=policy)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        return str(exc)
    return ""


def policy_supported(policy: str) -> bool:
    """Whether ``SamplingParams(speculative_tokens=policy)`` is accepted."""
    return not _policy_error(policy)


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise LabError(f"k must be an int in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")


def _check_tree(tree: tuple[int, ...]) -> None:
    if not tree or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in tree):
        raise LabError(f"a tree shape is a non-empty tuple of branching factors >= 1, got {tree!r}")


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1-6"``, ``"1,3,5"`` or a mix (``"1-3,6"``) as sorted distinct draft counts. LabError for
    anything else or a count outside 1..MAX_SPECULATIVE_TOKENS.

    >>> parse_ks("1-3,6")
    (1, 2, 3, 6)
    """
    ks: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise LabError(f"--k takes ranges and lists like 1-6 or 1,3,5, got {text!r}") from None
        if first > last:
            raise LabError(f"--k range {part.strip()!r} is empty")
        for k in range(first, last + 1):
            _check_k(k)
            ks.add(k)
    return tuple(sorted(ks))


def parse_names(text: str, what: str) -> tuple[str, ...]:
    """A comma list of names (drafters), in order. LabError for an empty or repeated name."""
    names = tuple(n.strip() for n in text.split(","))
    if any(not n for n in names):
        raise LabError(f"{what}: empty name in {text!r}")
    if len(set(names)) != len(names):
        raise LabError(f"{what}: a name repeats in {text!r}")
    return names


def parse_trees(values: list[str]) -> tuple[tuple[int, ...], ...]:
    """Tree shapes from ``--trees`` values: each value holds shapes separated by ``;``, a shape
    being branching factors per depth separated by commas (``"3,2,1;2,2"`` is two trees). LabError
    for anything else.

    >>> parse_trees(["3,2,1;2,2", "4"])
    ((3, 2, 1), (2, 2), (4,))
    """
    out = []
    for value in values:
        for shape in value.split(";"):
            try:
                tree = tuple(int(b) for b in shape.split(","))
            except ValueError:
                raise LabError("--trees takes branching factors like 3,2,1 (';' between trees), "
                               f"got {value!r}") \
                    from None
            _check_tree(tree)
            out.append(tree)
    return tuple(out)
