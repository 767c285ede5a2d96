"""The models a lab run decodes with: one plain model and one per drafter, loaded (and so validated)
before anything is generated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .config import LabConfig, drafter_load_kwargs
from .errors import LabError
from .timing import TimedDrafter, install_timer
from .workload import Prompt

if TYPE_CHECKING:
    from ..language_model import LanguageModel

# rows per pool: one for the timed runs, a few for the sample groups of the distribution test
MAX_BATCH_SIZE = 4


def load_model(config: LabConfig, max_seq_len: int | None = None, **kwargs: Any) -> LanguageModel:
    """``config.model`` (a folder) or the shipped model of ``config.kind``, with ``from_pretrained``
    ``kwargs``."""
    from ..language_model import LanguageModel

    kwargs.update(max_batch_size=MAX_BATCH_SIZE, max_seq_len=max_seq_len)
    if config.model is None:
        return LanguageModel.default(kind=config.kind, **kwargs)
    return LanguageModel.from_pretrained(config.model, **kwargs)


@dataclass
class LabModels:
    """``plain`` (no drafter) and, per lab drafter name, a model with that drafter wrapped in a
    ``TimedDrafter`` (``timers``). ``close()`` closes them all."""

    plain: LanguageModel
    drafting: dict[str, LanguageModel] = field(default_factory=dict)
    timers: dict[str, TimedDrafter] = field(default_factory=dict)

    @classmethod
    def load(cls, config: LabConfig, drafters: list[str], prompts: list[Prompt]) -> LabModels:
        """Load the plain model, check every prompt fits its context, then load one model per
        drafter. LabError (every model loaded so far closed) for a ``config.model`` that is not a
        model folder or does not load (the message names the folder), a prompt that does not fit, a
        drafter name ``build_drafter`` refuses, or a drafter that gives no drafter on this model
        (e.g. "mtp" without an MTP head)."""
        from ..models.checkpoint.folder import load_error, model_folder_problem

        problem = None if config.model is None else model_folder_problem(config.model)
        if problem is not None:
            raise LabError(problem)
        try:
            plain = load_model(config, drafter=None)
        # whatever the checkpoint's files provoke: one line naming the folder
        except Exception as exc:
            raise LabError(load_error(config.model, exc, config.kind)) from None
        models = cls(plain)
        try:
            need = max(len(plain.encode(p.prompt)) + (p.max_new_tokens or config.new_tokens)
                       for p in prompts)
            if need > plain.max_seq_len:
                raise LabError(f"the longest prompt plus its new tokens needs {need} tokens; the "
                               f"model's context is {plain.max_seq_len}")
            for name in drafters:
                try:
                    lm = load_model(config, plain.max_seq_len, **drafter_load_kwargs(name))
                except ValueError as exc:
                    raise LabError(f"drafter {name!r}: {exc}") from None
                if lm.drafter is None:
                    lm.close()
                    raise LabError(f"drafter {name!r} gives no drafter on this model (no MTP head, "
                                   f"or no memory for its draft pool)")
                models.drafting[name] = lm
                models.timers[name] = install_timer(lm)
            for lm in models.all():
                lm.pool.set_prefix_reuse(config.prefix_reuse)
        except BaseException:
            models.close()
            raise
        return models

    def all(self) -> list[LanguageModel]:
        return [self.plain, *self.drafting.values()]

    def set_prefix_reuse(self, on: bool) -> None:
        for lm in self.all():
            lm.pool.set_prefix_reuse(on)

    def close(self) -> None:
        for lm in self.all():
            lm.close()
