"""Packed low-bit KV on a CUDA device: the codecs quantize and decode there, and attention reads each forward's view
(in the working dtype: float32 and bfloat16) under its sub-row CSR, against the float64 oracle of
``test_pool_packed`` (the same windows: a prefill over pages, decode steps, a verify across a page boundary taken
back); a model on CUDA with nvfp4 KV gives the same tokens from a prefix hit and from speculation as from a cold
plain run. (FlashInfer reads the same views as any dense bfloat16 cache; its head-dim limits make the shipped
models' head dim of 32 fall back to the torch backend, and ``test_flashinfer_cuda`` covers its CSR reading.)"""

from __future__ import annotations

import math

import pytest
import torch

from smile_llm.cache import KvCachePool

from .test_pool_packed import FORMATS, HQ, PS, D, H, Oracle

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_windows_read_what_the_oracle_reads_on_cuda(dtype: torch.dtype) -> None:
    from smile_llm.attention.torch.backend import TorchBackend

    pool = KvCachePool(len(FORMATS), 24 * PS, H, D, PS, "cuda", kv_formats=FORMATS, num_tails=8, compute_dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    rid = pool.bind_request(list(range(37)), 96)
    pool.activate_step(rid)
    oracle = Oracle(96)
    tol = 2e-5 if dtype == torch.float32 else 3 * 2 ** -7  # bfloat16: a few units of its 8-bit mantissa

    def forward(start: int, n: int) -> None:
        kv = pool.kv_step(start, n)
        meta, qo = kv.attention_csr()
        backend = TorchBackend()
        backend.plan(meta, num_qo_heads=HQ, num_kv_heads=H, head_dim=D, qo_indptr=qo, causal=True, q_dtype=dtype,
                     kv_dtype=dtype)
        for layer in range(len(FORMATS)):
            k = torch.randn(1, n, H, D, generator=gen) * torch.linspace(0.5, 4, D)
            v = torch.randn(1, n, H, D, generator=gen)
            q = torch.randn(n, HQ, D, generator=gen)
            # the oracle reads what the pool stored: the values in the working dtype
            k, v, q = (x.to(dtype).float() for x in (k, v, q))
            kv.write(layer, k.to("cuda", dtype), v.to("cuda", dtype))
            oracle.write(layer, start, k[0], v[0])
            out = backend.run(q.to("cuda", dtype), kv.key_pages(layer), kv.value_pages(layer))
            want = oracle.attend(layer, q, list(range(start, start + n)))
            scale = max(1.0, float(want.abs().max()))
            assert float((out.double().cpu() - want).abs().max()) <= tol * scale * math.sqrt(D)
        kv.commit()
        pool.check_invariants()

    forward(0, 37)
    for pos in range(37, 44):
        forward(pos, 1)
    forward(44, 7)
    pool.truncate_to(46, 51)
    forward(46, 5)


def test_a_model_on_nvfp4_kv_reads_the_same_however_the_forwards_were_cut_on_cuda() -> None:
    from smile_llm import LanguageModel

    system = "# A small utility module.\nimport os\nimport sys\n\n\n"
    lm = LanguageModel.default(device="cuda", max_seq_len=256, kv_dtype="nvfp4")
    cold = LanguageModel.default(device="cuda", max_seq_len=256, kv_dtype="nvfp4")
    try:
        lm.generate(system + "def read_lines(path):\n", 8, speculative_tokens=0)
        warm = lm.generate(system + "def main(argv):\n", 32, speculative_tokens=0)
        spec = lm.generate(system + "def main(argv):\n", 32, speculative_tokens=3)
        cold.pool.prefix_reuse_enabled = False
        fresh = cold.generate(system + "def main(argv):\n", 32, speculative_tokens=0)
        assert warm.stats["cached_tokens"] == 48 and warm.tokens == fresh.tokens == spec.tokens
    finally:
        lm.close()
        cold.close()
