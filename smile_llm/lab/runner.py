"""``run_lab``: every configuration of a ``LabConfig`` on the same prompts, against plain decoding,
in one process.

Order of work: load the workload and every model (bad input raises ``LabError`` before anything is
generated); one warm-up call per configuration (which also validates its ``generate`` arguments);
then ``repeats`` passes over the prompts, each prompt decoded plainly and then by every
configuration of one drafter, drafter after drafter (plain runs interleaved with speculative ones,
so drift in the machine's speed hits both); at temperature > 0 the distribution test last. The
greedy check covers every repeat's outputs, and so does the seeded check at temperature > 0 for
greedy drafts (plain and speculative runs of a prompt share a seed); the round trace, forwards and
token counts come from the first repeat (later repeats decode the same tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..serving.request import MAX_SAMPLES
from .config import Configuration, LabConfig
from .errors import LabError
from .lossless import Mismatch, distribution_check, first_mismatch, greedy_check
from .models import LabModels
from .provenance import environment
from .result import ConfigResult, LabResult, Timings
from .trace import RoundTally
from .workload import Prompt, load_workload

if TYPE_CHECKING:
    from ..serving.completion import Completion
    from ..language_model import LanguageModel


def _generate(lm: LanguageModel, prompt: Prompt, new_tokens: int, config: LabConfig, seed: int,
              speculative_tokens: int | str, kwargs: Mapping[str, Any],
              on_round: Callable[[Any], None] | None = None) -> tuple[Completion, float]:
    """One timed ``generate`` call: the completion and its wall seconds."""
    begin = time.perf_counter()
    out = lm.generate(prompt.prompt, new_tokens, temperature=config.temperature, seed=seed,
                      speculative_tokens=speculative_tokens, on_round=on_round,
                      **kwargs)  # type: ignore[arg-type]
    return out, time.perf_counter() - begin


def _warm_up(models: LabModels, configurations: list[Configuration], prompt: Prompt,
             config: LabConfig) -> None:
    """One short call per model and configuration; LabError naming a configuration whose arguments
    ``generate`` refuses."""
    _generate(models.plain, prompt, 8, config, config.seed, 0, {})
    for c in configurations:
        try:
            _generate(models.drafting[c.drafter], prompt, 8, config, config.seed,
                      c.speculative_tokens, c.generate_kwargs)
        except (TypeError, ValueError) as exc:
            raise LabError(f"configuration {c.label!r}: {exc}") from None
    for timer in models.timers.values():
        timer.take()


def _sample_outcomes(lm: LanguageModel, prompt: Prompt, config: LabConfig, seed: int,
                     speculative_tokens: int | str,
                     kwargs: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """``config.samples`` seeded draws of the first ``config.sample_tokens`` tokens after ``prompt``
    (sample groups of at most MAX_SAMPLES, group g seeded ``seed + g``)."""
    outcomes: list[tuple[int, ...]] = []
    group = 0
    while len(outcomes) < config.samples:
        n = min(MAX_SAMPLES, config.samples - len(outcomes))
        outs = lm.generate(prompt.prompt, config.sample_tokens, temperature=config.temperature,
                           seed=seed + group, speculative_tokens=speculative_tokens, n=n,
                           **kwargs)  # type: ignore[arg-type]
        outcomes += [tuple(c.tokens) for c in (outs if isinstance(outs, list) else [outs])]
        group += 1
    return outcomes


def seeded_identity(c: Configuration) -> bool:
    """Whether ``c``'s seeded outputs must equal plain decoding's with the same seed token for token
    at any temperature: its drafts are greedy, so every token is the target's own draw with the
    positional uniform of its position, the draw plain decoding makes (with sampled drafts,
    rejection sampling keeps only the distribution)."""
    return c.generate_kwargs.get("draft_sampling", "greedy") != "sample"


def _distribution_test(models: LabModels, results: list[ConfigResult], prompts: list[Prompt],
                       config: LabConfig, mismatches: dict[str, list[Mismatch]],
                       say: Callable[[str], None]) -> None:
    """Sets every result's ``check`` from the chi-square test against plain samples (prefix reuse on
    meanwhile: sample groups share their prompt's KV through it) and, for greedy drafts, the timed
    seeded runs' mismatches."""
    chosen = prompts[: config.sample_prompts]
    models.set_prefix_reuse(True)
    try:
        plain = [_sample_outcomes(models.plain, p, config, config.seed, 0, {}) for p in chosen]
        for i, r in enumerate(results):
            c = r.configuration
            seed = config.seed + 1_000_003 * (i + 1)  # seeds of no plain group
            spec = [_sample_outcomes(models.drafting[c.drafter], p, config, seed,
                                     c.speculative_tokens, c.generate_kwargs) for p in chosen]
            r.check = distribution_check(plain, spec,
                                         mismatches[c.label] if seeded_identity(c) else None)
            say(f"distribution test {c.label}: {r.check.describe()}")
    finally:
        models.set_prefix_reuse(config.prefix_reuse)


def _drop_unsupported_trees(models: LabModels, configurations: list[Configuration],
                            say: Callable[[str], None]) -> tuple[list[Configuration], list[str]]:
    """The configurations whose drafter can serve them, and a note per dropped one: a token-tree
    configuration needs a drafter with ``propose_tree``. LabError when trees were asked for and no
    drafter proposes them."""
    kept, notes = [], []
    for c in configurations:
        drafter = models.drafting[c.drafter].drafter
        if ("draft_tree" in c.generate_kwargs
                and not callable(getattr(drafter, "propose_tree", None))):
            notes.append(f"{c.label}: skipped, drafter {c.drafter!r} does not propose token trees")
            say(notes[-1])
        else:
            kept.append(c)
    trees = [c for c in configurations if "draft_tree" in c.generate_kwargs]
    if trees and not any(c in kept for c in trees):
        raise LabError(f"none of the drafters {sorted(models.drafting)} proposes token trees "
                       "(--trees)")
    return kept, notes


def _left(seconds: float) -> str:
    """A rough remaining time: "about 40 s left", "about 9 min left"."""
    return f"about {seconds:.0f} s left" if seconds < 90 else f"about {seconds / 60:.0f} min left"


class _RunCounter:
    """Numbers the timed runs of a lab pass and says one line per run: which run of how many, the
    repeat, prompt and configuration, its wall time, and the time left at the pace so far."""

    def __init__(self, total: int, say: Callable[[str], None]) -> None:
        self.total, self.done, self.say = total, 0, say
        self.begin = time.perf_counter()
        self.width = len(str(total))

    def ran(self, where: str, label: str, wall: float) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.begin
        left = elapsed / self.done * (self.total - self.done)
        self.say(f"[{self.done:>{self.width}}/{self.total}] {where}, {label}: {wall:.2f} s; "
                 f"{_left(left) if self.done < self.total else 'timed runs done'}")


def run_lab(config: LabConfig, progress: Callable[[str], None] | None = None) -> LabResult:
    """Run ``config`` (see the module docstring) and return what it measured; ``progress`` receives
    a line per step: loading, warming up, then one per timed run (plain or a configuration, with the
    time left), per repeat and per distribution test. LabError for bad input, before any generation.
    The lossless verdicts are in the result (``LabResult.passed``, ``failures``): a lossy
    configuration does not raise."""
    say = progress or (lambda line: None)
    prompts = load_workload(config.workload)
    configurations = config.configurations()
    drafters = list(dict.fromkeys(c.drafter for c in configurations))
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    say(f"loading the plain model and one per drafter ({', '.join(drafters)}); {len(prompts)} "
        f"prompts, {len(configurations)} configurations, {config.threads} torch thread(s)")
    models = LabModels.load(config, drafters, prompts)
    try:
        configurations, notes = _drop_unsupported_trees(models, configurations, say)
        say(f"warming up: one short call per configuration ({len(configurations)})")
        _warm_up(models, configurations, prompts[0], config)
        results = [ConfigResult(c) for c in configurations]
        groups = {d: [r for r in results if r.configuration.drafter == d] for d in drafters}
        groups = {d: g for d, g in groups.items() if g}
        mismatches: dict[str, list[Mismatch]] = {c.label: [] for c in configurations}
        plain = Timings()
        counter = _RunCounter(config.repeats * len(prompts) *
                              sum(1 + len(g) for g in groups.values()), say)
        for rep in range(config.repeats):
            for index, prompt in enumerate(prompts):
                new = prompt.max_new_tokens or config.new_tokens
                seed = config.seed + index
                where = (f"repeat {rep + 1}/{config.repeats}, "
                         f"prompt {index + 1}/{len(prompts)} ({prompt.id})")
                for drafter, group in groups.items():
                    base, wall = _generate(models.plain, prompt, new, config, seed, 0, {})
                    plain.add(prompt.id, wall, base.stats["decode_s"])
                    counter.ran(where, "plain", wall)
                    timer = models.timers[drafter]
                    for r in group:
                        c = r.configuration
                        tally = RoundTally()
                        timer.take()
                        out, wall = _generate(models.drafting[drafter], prompt, new, config, seed,
                                              c.speculative_tokens, c.generate_kwargs, tally.add)
                        r.timings.add(prompt.id, wall, out.stats["decode_s"], timer.take()[0])
                        counter.ran(where, c.label, wall)
                        if config.temperature == 0 or seeded_identity(c):
                            miss = first_mismatch(prompt.id, base.tokens, out.tokens)
                            if miss is not None:
                                mismatches[c.label].append(miss)
                                say(f"MISMATCH {c.label}: {miss.describe()}")
                        if rep == 0:
                            r.tally.merge(tally)
                            r.decode_forwards += out.stats["forwards"] - 1
                            r.decode_tokens += max(len(out.tokens) - 1, 0)
                            r.generated_tokens += len(out.tokens)
            say(f"repeat {rep + 1}/{config.repeats} done")
        if config.temperature == 0:
            for r in results:
                r.check = greedy_check(mismatches[r.configuration.label])
        else:
            _distribution_test(models, results, prompts, config, mismatches, say)
        env = environment(models.plain, config)
    finally:
        models.close()
        torch.set_num_threads(threads)
    return LabResult(config, prompts, plain, results, env, notes)
