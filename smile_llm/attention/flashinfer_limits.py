"""What FlashInfer's kernels can serve, checked without importing FlashInfer: the kernel a plan
takes, the kernel family, and every limit that keeps a plan (:func:`kernel_limit`) or a model
(:func:`model_limit`, which ``select_backend`` uses to choose per model) off them.

The kernels' limits (flashinfer-python 0.6.18 / 0.7.4 sources):

- queries fp16 or bf16; KV of the query dtype or FP8 (fa2 has no FP8 queries,
  ``jit/attention/modules.py``);
- the prefill kernel (and the tensor-core decode, which runs it): head dims 64, 128 and 256. fa2
  rejects head dims under 64 as an invalid tile configuration (``KernelTraits::IsInvalid``,
  ``NUM_MMA_D_VO < 4``, in ``include/flashinfer/attention/prefill.cuh``); fa3 instantiates 64, 128
  and 256 only (``static_assert`` in ``attention/hopper/prefill_sm90.cuh``;
  ``is_fa3_prefill_head_dim_supported`` in ``utils.py``);
- fa3: query and KV of one dtype, and no custom mask (``is_fa3_backend_supported``; its kernels
  return ``cudaErrorNotSupported`` for ``MaskMode::kCustom``);
- the CUDA-core decode: 1, 2, 3, 4, 6 or 8 query heads per KV head (``DISPATCH_GQA_GROUP_SIZE``)
  and a power-of-two head dim of 16 to 256 (32 with FP8 KV) so that its ``bdx`` lanes per head are
  at least its two pipeline stages (``static_assert(num_stages_smem <= bdx)`` in
  ``attention/decode.cuh``).

Kernel family (FlashInfer's ``backend``): "fa3" for the prefill wrapper on compute capability 9.x
(Hopper) when fa3 can serve the plan (matching query and KV dtypes, head dim 64/128/256, no custom
mask), "fa2" everywhere else (decode, FP8 KV, token-tree masks, other GPUs).
"""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
TENSOR_CORE_MIN_GROUP = 4  # SGLang's should_use_tensor_core: GQA group >= 4, or FP8 KV
FA3_MAJOR = 9  # compute capability major of the GPUs FlashInfer's fa3 kernels run on (Hopper)
KERNEL_FAMILIES = ("fa2", "fa3")
KERNELS = ("decode", "decode_tc", "prefill")
# the prefill kernel on fa2 and fa3, and the tensor-core decode (it runs prefill's)
PREFILL_HEAD_DIMS = (64, 128, 256)
# DISPATCH_GQA_GROUP_SIZE in include/flashinfer/utils.cuh
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 6, 8)
CUDA_CORE_DECODE_MAX_HEAD_DIM = 256
# the CUDA-core decode's shared-memory stages on sm_80 and later; <= its bdx lanes
DECODE_PIPELINE_STAGES = 2


def decode_kernel(group: int, kv_dtype: torch.dtype, use_tensor_cores: bool | None = None) -> str:
    """The decode kernel for ``group`` query heads per KV head: "decode_tc" (the prefill kernel on
    tensor cores) when ``use_tensor_cores``, or, when that is None, by SGLang's rule (a group of 4
    or more, or FP8 KV); else "decode" (the CUDA-core kernel)."""
    if use_tensor_cores is None:
        use_tensor_cores = group >= TENSOR_CORE_MIN_GROUP or kv_dtype in FP8_DTYPES
    return "decode_tc" if use_tensor_cores else "decode"


def _cuda_core_decode_serves(head_dim: int, kv_dtype: torch.dtype) -> bool:
    # decode.cuh: vec_size = max(16 / sizeof(KV), D / 32), bdx = D / vec_size lanes per head,
    # reduced by a butterfly over bdx (a power of two) and at least the pipeline stages.
    if head_dim > CUDA_CORE_DECODE_MAX_HEAD_DIM or head_dim & (head_dim - 1):
        return False
    vec = max(16 // kv_dtype.itemsize, head_dim // 32)
    return head_dim % vec == 0 and DECODE_PIPELINE_STAGES <= head_dim // vec <= 32


def _limits(kernel: str, family: str, head_dim: int, group: int, q_dtype: torch.dtype,
            kv_dtype: torch.dtype, custom_mask: bool) -> list[str]:
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if family not in KERNEL_FAMILIES:
        raise ValueError(f"family must be one of {KERNEL_FAMILIES}, got {family!r}")
    out = []
    if q_dtype not in HALF_DTYPES:
        out.append(f"{q_dtype} queries (FlashInfer has float16 and bfloat16 kernels only)")
    elif kv_dtype != q_dtype and kv_dtype not in FP8_DTYPES:
        out.append(f"{q_dtype} queries over {kv_dtype} KV (the KV must be of the query dtype or "
                   f"FP8)")
    if kernel == "decode":
        if not _cuda_core_decode_serves(head_dim, kv_dtype):
            out.append(f"head dim {head_dim} (the CUDA-core decode runs powers of two from "
                       f"{DECODE_PIPELINE_STAGES * (16 // kv_dtype.itemsize)} to "
                       f"{CUDA_CORE_DECODE_MAX_HEAD_DIM} over {kv_dtype} KV)")
        if group not in CUDA_CORE_DECODE_GROUPS:
            out.append(f"{group} query heads per KV head (the CUDA-core decode serves "
                       f"{', '.join(map(str, CUDA_CORE_DECODE_GROUPS))})")
    elif head_dim not in PREFILL_HEAD_DIMS:
        out.append(f"head dim {head_dim} (the prefill kernels run "
                   f"{', '.join(map(str, PREFILL_HEAD_DIMS))} only)")
    if custom_mask and kernel != "prefill":
        out.append("a custom mask without a query window (the prefill kernel has masks)")
    if family == "fa3":
        if kernel != "prefill":
            out.append("fa3 for a decode kernel (fa3 serves the prefill wrapper here)")
        if q_dtype in HALF_DTYPES and kv_dtype != q_dtype:
            out.append(f"fa3 over {kv_dtype} KV under {q_dtype} queries (fa3 needs one dtype)")
        if custom_mask:
            out.append("a custom mask on fa3 (its kernels return cudaErrorNotSupported)")
    return out


def kernel_limit(kernel: str, family: str, *, head_dim: int, group: int, q_dtype: torch.dtype,
                 kv_dtype: torch.dtype, custom_mask: bool = False) -> str | None:
    """Why FlashInfer's ``kernel`` ("decode", "decode_tc" or "prefill") on kernel ``family``
    ("fa2" or "fa3") cannot serve a plan of this head dim, GQA ``group`` (query heads per KV head),
    query and KV dtypes and mask, or None when it can. Every limit that applies is named,
    "; "-separated (this module's docstring lists them and where FlashInfer sets them). ValueError
    for an unknown kernel or family."""
    limits = _limits(kernel, family, head_dim, group, q_dtype, kv_dtype, custom_mask)
    return "; ".join(limits) or None


def model_limit(*, head_dim: int, num_qo_heads: int, num_kv_heads: int, q_dtype: torch.dtype,
                kv_dtype: torch.dtype) -> str | None:
    """Why FlashInfer cannot serve every forward of a model with this attention geometry (fa2's
    prefill kernel for prompts, verify windows and token-tree masks; the decode kernel
    :func:`decode_kernel` picks; fa3 is only ever taken where it can serve), or None when it can.
    The reasons are named as :func:`kernel_limit` names them. ValueError when the heads do not
    form GQA groups."""
    if num_qo_heads < 1 or num_kv_heads < 1 or num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads {num_qo_heads} must be a positive multiple of num_kv_heads "
                         f"{num_kv_heads}")
    group = num_qo_heads // num_kv_heads
    out: list[str] = []
    for kernel in ("prefill", decode_kernel(group, kv_dtype)):
        limits = _limits(kernel, "fa2", head_dim, group, q_dtype, kv_dtype, False)
        out += [r for r in limits if r not in out]
    return "; ".join(out) or None


def default_kernel_backend(kernel: str, capability: tuple[int, int] | None, q_dtype: torch.dtype,
                           kv_dtype: torch.dtype, head_dim: int, *,
                           custom_mask: bool = False) -> str:
    """FlashInfer's ``backend`` for ``kernel`` on a GPU of ``capability``: "fa3" for the prefill
    wrapper on Hopper when fa3 can serve the plan (:func:`kernel_limit`: matching query and KV
    dtypes, head dim 64/128/256, no custom mask), "fa2" otherwise (decode is memory-bound; fa2
    serves every GPU and has custom masks)."""
    if (kernel == "prefill" and capability is not None and capability[0] == FA3_MAJOR
            and not _limits("prefill", "fa3", head_dim, 1, q_dtype, kv_dtype, custom_mask)):
        return "fa3"
    return "fa2"
