"""Drafters by name: ``register_drafter`` and ``"package.module:callable"`` strings.

- a factory registered by name builds the drafter of ``from_pretrained(..., drafter=name)`` from the target's parts
  (``DrafterContext``), and decoding with it equals plain decoding;
- a factory in a module written outside the package, named ``"module:callable"``, does the same without
  registration;
- a factory returning None means plain decoding; one returning something else is refused;
- unknown names are refused with the accepted forms and the registered names; bad, reserved and duplicate
  registrations, and ``"module:callable"`` strings that do not resolve, are refused by name.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from smile_llm.language_model import LanguageModel
from smile_llm.speculative.drafters import (DrafterContext, NgramDrafter, register_drafter, registered_drafters,
                                      unregister_drafter)

from tests.hf_zoo import assert_clean
from tests.models.mtp_models import build_mtp_model

PROMPTS = [[(7 * i + 3) % 97 for i in range(22)], [4, 8, 15, 4, 8, 15, 4, 8]]
NEW = 24

OUTSIDE_MODULE = '''
"""A drafter package written outside smile_llm."""
from smile_llm.speculative.drafters import NgramDrafter

built = []


def make(ctx):
    built.append(ctx)
    return NgramDrafter(1, 2, num_speculative_tokens=3)


class Factories:
    @staticmethod
    def none(ctx):
        return None


not_callable = 3
'''


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mtp_model(tmp_path_factory.mktemp("target"), "llama", seed=31, mtp_num_hidden_layers=0)


def load(path: Path, drafter: Any) -> LanguageModel:
    return LanguageModel.from_pretrained(path, page_size=4, max_seq_len=128, drafter=drafter)


@pytest.fixture(scope="module")
def plain(target: Path) -> Any:
    lm = load(target, None)
    yield lambda prompt: lm.generate(prompt, NEW, speculative_tokens=0).tokens
    lm.close()


@pytest.fixture
def names() -> Any:
    """Names registered by a test, unregistered after it."""
    taken: list[str] = []
    yield taken
    for name in taken:
        unregister_drafter(name)


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of drafter factories on ``sys.path``, under a name unique to the test; returns its name."""
    name = f"outside_drafters_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(OUTSIDE_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_registered_name_builds_the_drafter_from_the_targets_parts(target, plain, names):
    seen: list[DrafterContext] = []

    def lookup(ctx: DrafterContext) -> NgramDrafter:
        seen.append(ctx)
        return NgramDrafter(1, 3, num_speculative_tokens=2)

    register_drafter("prompt-lookup.short", lookup)
    names.append("prompt-lookup.short")
    assert "prompt-lookup.short" in registered_drafters()
    lm = load(target, "prompt-lookup.short")
    assert isinstance(lm.drafter, NgramDrafter) and lm.drafter.max_n == 3
    (ctx,) = seen
    assert ctx.pool is lm.pool and ctx.transformer is lm.transformer and ctx.backend is lm.backend
    assert ctx.max_seq_len == 128 and ctx.vocab_size == 97 and ctx.config is lm.config and ctx.draft_kv == "history"
    assert lm.serving_context.speculative_tokens_for(None) == 2
    rounds = 0
    for prompt in PROMPTS:
        c = lm.generate(prompt, NEW)
        assert c.tokens == plain(prompt)
        rounds += c.stats["speculative_rounds"]
    assert rounds > 0
    assert_clean(lm.pool)
    lm.close()


def test_a_module_callable_string_builds_without_registration(target, plain, outside):
    lm = load(target, f"{outside}:make")
    module = __import__(outside)
    assert len(module.built) == 1 and module.built[0].pool is lm.pool
    assert isinstance(lm.drafter, NgramDrafter) and (lm.drafter.min_n, lm.drafter.max_n) == (1, 2)
    out = lm.generate_batch(PROMPTS, NEW)
    assert [c.tokens for c in out] == [plain(p) for p in PROMPTS]
    assert sum(c.stats["speculative_rounds"] for c in out) > 0
    assert_clean(lm.pool)
    lm.close()
    assert load(target, f"{outside}:Factories.none").drafter is None  # None from a factory: plain decoding


def test_unknown_names_and_bad_factories_are_refused_by_name(target, outside, names):
    register_drafter("mine", lambda ctx: NgramDrafter())
    names.append("mine")
    with pytest.raises(ValueError, match=r"unknown name 'eagle'") as info:
        load(target, "eagle")
    for form in ('"mtp"', '"ngram"', '"draft:PATH"', "a registered name (mine)", '"package.module:callable"'):
        assert form in str(info.value)
    register_drafter("not-a-drafter", lambda ctx: "a string")
    names.append("not-a-drafter")
    with pytest.raises(ValueError, match=r"'not-a-drafter' returned 'a string', not a Drafter"):
        load(target, "not-a-drafter")
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_module_here'"):
        load(target, "no_such_module_here:make")
    with pytest.raises(ValueError, match=r"has no attribute 'missing'"):
        load(target, f"{outside}:missing")
    with pytest.raises(ValueError, match=r"'not_callable' is not callable"):
        load(target, f"{outside}:not_callable")


def test_registration_checks_names_and_factories(names):
    for bad in ("", "a:b", "3d", "with space", None):
        with pytest.raises(ValueError, match="drafter name"):
            register_drafter(bad, lambda ctx: None)  # type: ignore[arg-type]
    for reserved in ("mtp", "ngram", "none", "draft"):
        with pytest.raises(ValueError, match="built-in"):
            register_drafter(reserved, lambda ctx: None)
    with pytest.raises(TypeError, match="callable"):
        register_drafter("fine", 3)  # type: ignore[arg-type]
    register_drafter("twice", lambda ctx: None)
    names.append("twice")
    with pytest.raises(ValueError, match="already registered"):
        register_drafter("twice", lambda ctx: None)
    register_drafter("twice", lambda ctx: NgramDrafter(), replace=True)
    unregister_drafter("twice")
    unregister_drafter("twice")  # a second time: nothing
    assert "twice" not in registered_drafters()
