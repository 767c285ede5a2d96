"""Tensor and pipeline parallelism on ``torch.distributed``: the process group (``group``), the
lockstep that makes every rank's pools take rank 0's decisions (``lockstep``), and the pipeline's
stages and their point-to-point transfers (``pipeline``); the sharding of a checkpoint is
``models.sharding``, a stage's part of the model ``models.stages``. Launched by ``torchrun``: NCCL
on CUDA, gloo on the CPU."""

from .group import TensorParallel, init_tensor_parallel

__all__ = ["TensorParallel", "init_tensor_parallel"]
