"""ModelOptions: what a server loads its model with (``smile-llm serve``'s model flags), in one
picklable value, so that every process that loads the model (the server, each Ray Serve replica,
each tensor-parallel rank of a replica) loads the same one."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..language_model import LanguageModel


@dataclass(frozen=True)
class ModelOptions:
    """``model``: a checkpoint folder (None: the shipped model of ``kind``); ``drafter``
    ("mtp", "ngram", "draft:DIR" or None); ``kv_dtype``; the batch and context limits;
    ``speculative_max_batch``; ``tensor_parallel`` (ranks per model); ``threads``: torch's
    intra-op threads in each process (None: torch's default); ``compile``: run the model's layers
    compiled, warmed up before serving (None: ``compiles`` decides)."""

    model: str | None = None
    kind: str = "dense"
    drafter: str | None = "mtp"
    kv_dtype: str | None = None
    max_batch_size: int = 8
    max_seq_len: int | None = None
    speculative_max_batch: int | None = None
    tensor_parallel: int = 1
    threads: int | None = None
    compile: bool | None = None

    @property
    def folder(self) -> Path:
        """The model's folder."""
        from ..models.shipped import DEFAULT_MODEL_DIRS

        return Path(self.model) if self.model is not None else Path(DEFAULT_MODEL_DIRS[self.kind])

    def load(self) -> LanguageModel:
        """The ``LanguageModel`` (in a tensor-parallel job: this rank's; the process group must
        exist, from ``torchrun`` or ``init_process_group``)."""
        import torch

        from ..language_model import LanguageModel

        if self.threads is not None:
            torch.set_num_threads(self.threads)
        lm = LanguageModel.from_pretrained(
            self.folder, drafter=self.drafter, kv_dtype=self.kv_dtype,
            max_batch_size=self.max_batch_size, max_seq_len=self.max_seq_len,
            tensor_parallel=self.tensor_parallel, speculative_max_batch=self.speculative_max_batch,
            compile=self.compiles)
        if lm.compile_stats["compiled"] and not lm.is_follower:
            stats = lm.warm_up()  # the variants made before the first request (followers follow)
            logging.getLogger("smile_llm.server").info(
                "compiled forward: %d variants in %.1f s", stats["compiled_variants"],
                stats["compile_seconds"])
        return lm

    @property
    def compiles(self) -> bool:
        """Whether the model runs compiled: ``compile``, else ``SMILE_COMPILE``, else where it
        measurably wins (docs/compile.md): models without Gated DeltaNet layers. On a hybrid model
        the DeltaNet mixers, which run outside the graph, take most of a step, and compiling the
        rest measured no faster."""
        from .. import env
        from ..models.checkpoint.config import ModelConfig

        setting = self.compile if self.compile is not None else env.compile_setting()
        if setting is not None:
            return setting
        try:
            return not ModelConfig.from_pretrained(self.folder).is_hybrid
        except (OSError, ValueError):  # loading the model reports what is wrong with the folder
            return False
