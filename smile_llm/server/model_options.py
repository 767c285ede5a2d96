"""ModelOptions: what a server loads its model with (``smile-llm serve``'s model flags), in one
picklable value, so that every process that loads the model (the server, each Ray Serve replica,
each tensor-parallel rank of a replica) loads the same one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelOptions:
    """``model``: a checkpoint folder (None: the shipped model of ``kind``); ``drafter``
    ("mtp", "ngram", "draft:DIR" or None); ``kv_dtype``; the batch and context limits;
    ``speculative_max_batch``; ``tensor_parallel`` (ranks per model); ``threads``: torch's
    intra-op threads in each process (None: torch's default)."""

    model: str | None = None
    kind: str = "dense"
    drafter: str | None = "mtp"
    kv_dtype: str | None = None
    max_batch_size: int = 8
    max_seq_len: int | None = None
    speculative_max_batch: int | None = None
    tensor_parallel: int = 1
    threads: int | None = None

    @property
    def folder(self) -> Path:
        """The model's folder."""
        from ..models.shipped import DEFAULT_MODEL_DIRS

        return Path(self.model) if self.model is not None else Path(DEFAULT_MODEL_DIRS[self.kind])

    def load(self) -> Any:
        """The ``LanguageModel`` (in a tensor-parallel job: this rank's; the process group must
        exist, from ``torchrun`` or ``init_process_group``)."""
        import torch

        from ..language_model import LanguageModel

        if self.threads is not None:
            torch.set_num_threads(self.threads)
        return LanguageModel.from_pretrained(
            self.folder, drafter=self.drafter, kv_dtype=self.kv_dtype,
            max_batch_size=self.max_batch_size, max_seq_len=self.max_seq_len,
            tensor_parallel=self.tensor_parallel, speculative_max_batch=self.speculative_max_batch)
