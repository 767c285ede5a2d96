"""Tensor parallelism on ``torch.distributed``: the process group (``group``), the sharding of
a checkpoint and of the model's geometry (``sharding``), and the lockstep that makes every
rank's pools take rank 0's decisions (``lockstep``). Launched by ``torchrun``: NCCL on CUDA,
gloo on the CPU."""

from .group import TensorParallel, init_tensor_parallel

__all__ = ["TensorParallel", "init_tensor_parallel"]
