"""Backend choice and the FlashInfer backend's plumbing, on CPU.

FlashInfer itself needs a GPU (tests/attention/test_flashinfer_cuda.py). Here the strict stand-in of
``tests/flashinfer_fake.py`` (the real wrappers' signatures and checks, attention computed by the reference) records
what the backend passes, so the argument names, the fixed CUDA-graph buffers, the kernel and kernel-family choice,
the bound-CSR check and the rows that see no key are checked without one. Head dim 64 throughout: FlashInfer's
prefill kernels run 64, 128 and 256 only (tests/attention/test_kernel_limits.py covers the limits and the choice
per model).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import smile_llm.attention.flashinfer as fi_backend
from smile_llm.attention import AttentionBackend, FlashInferBackend, select_backend
from smile_llm.attention.flashinfer import INSTALL_HINT, import_flashinfer, rows_without_keys
from smile_llm.attention.flashinfer_limits import default_kernel_backend
from smile_llm.cache.metadata import FlashInferKvMetadata

from ..flashinfer_fake import FakeFlashInfer, install

REPO = Path(__file__).resolve().parents[2]
D = 64  # head dim: the smallest FlashInfer's prefill kernels run


# ------------------------------------------------------------------------------------------------ choosing
def test_select_backend_on_cpu_is_the_torch_backend() -> None:
    from smile_llm.attention import TorchBackend

    for prefer in (None, "reference"):
        backend = select_backend("cpu", prefer=prefer)
        assert isinstance(backend, TorchBackend)
        assert isinstance(backend, AttentionBackend)
        assert backend.name == "reference"


def test_prefer_flashinfer_on_cpu_raises_runtime_error() -> None:
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        select_backend(torch.device("cpu"), prefer="flashinfer")


def test_unknown_preference_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="prefer must be"):
        select_backend("cpu", prefer="triton")


def test_flashinfer_backend_refuses_a_cpu_device_before_touching_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # any import attempt would raise ImportError
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        FlashInferBackend("cpu")


def test_missing_flashinfer_raises_import_error_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[gpu\]'` in the smile-llm checkout") as info:
        import_flashinfer()
    assert "flashinfer-python" in str(info.value) and str(info.value) == INSTALL_HINT
    assert not fi_backend.flashinfer_available()


def test_importing_the_package_never_imports_flashinfer() -> None:
    # A meta-path finder records every attempt to import flashinfer, installed here or not.
    script = textwrap.dedent("""
        import sys
        attempts = []
        class Spy:
            def find_spec(self, name, path=None, target=None):
                if name == "flashinfer" or name.startswith("flashinfer."):
                    attempts.append(name)
                return None
        sys.meta_path.insert(0, Spy())
        import smile_llm
        import smile_llm.attention
        from smile_llm.attention import select_backend, FlashInferBackend, AttentionBackend
        import smile_llm.attention.flashinfer, smile_llm.attention.backend
        select_backend("cpu")
        try:
            FlashInferBackend("cpu")
        except RuntimeError:
            pass
        assert not attempts, attempts
        assert "flashinfer" not in sys.modules
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# ------------------------------------------------------------------------------------------------ host logic
def test_rows_without_keys() -> None:
    kv = np.array([5, 0, 2, 7])
    assert rows_without_keys(kv, None, causal=True).tolist() == [1]  # decode: the empty row
    qo = np.array([0, 3, 5, 9, 10])  # qo_len 3, 2, 4, 1
    # Empty row 1 -> rows 3, 4; row 2 has 4 queries over 2 keys -> its first 2 (rows 5, 6) see nothing when causal.
    assert rows_without_keys(kv, qo, causal=True).tolist() == [3, 4, 5, 6]
    assert rows_without_keys(kv, qo, causal=False).tolist() == [3, 4]
    assert rows_without_keys(np.array([4, 4]), np.array([0, 2, 2]), causal=True).tolist() == []


# ------------------------------------------------------------------------------------------------ stand-in
@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch) -> type[FakeFlashInfer]:
    return install(monkeypatch)


def _csr(lengths: list[int], page_size: int) -> FlashInferKvMetadata:
    """Rows on consecutive pages from page 3 on, one spare index entry (over-provisioned like the verify CSR)."""
    pages = [-(-n // page_size) for n in lengths]
    indptr = np.concatenate([[0], np.cumsum(pages)])
    indices = np.arange(3, 3 + indptr[-1] + 1)
    last = [(n - 1) % page_size + 1 if n else 0 for n in lengths]
    return FlashInferKvMetadata(_int32(indptr), _int32(indices), _int32(last), page_size)


def _int32(values: Any) -> torch.Tensor:
    return torch.tensor(np.asarray(values), dtype=torch.int32)


def _cache(num_pages: int, page_size: int, hkv: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(num_pages * page_size, hkv, d).to(dtype)  # the pool's [num_slots, Hkv, D] view


def test_decode_plans_the_decode_wrapper_with_keyword_arguments(fake_flashinfer: type[FakeFlashInfer]) -> None:
    backend = FlashInferBackend("cpu")
    meta = _csr([5, 9], 4)
    backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, sm_scale=0.25, logits_soft_cap=0.0,
                 q_dtype=torch.float16, kv_dtype=torch.float16)
    assert backend.kernel == "decode"
    (w,) = fake_flashinfer.wrappers
    assert w.init["use_tensor_cores"] is False and w.init["use_cuda_graph"] is False
    assert w.init["backend"] == "fa2" and w.init["kv_layout"] == "NHD"
    assert w.init["workspace"].numel() == 1024 and w.init["workspace"].dtype == torch.uint8
    plan = w.plans[0]
    assert plan["indptr"] is meta.indptr and plan["indices"] is meta.indices and plan["last"] is meta.last_page_len
    assert plan["heads"] == (2, 2) and plan["head_dim"] == D and plan["page_size"] == 4
    assert plan["q_data_type"] == torch.float16 and plan["kv_data_type"] == torch.float16
    assert plan["sm_scale"] == 0.25 and plan["logits_soft_cap"] is None  # 0 means no cap

    cache = _cache(8, 4, 2, D, torch.float16)
    out = backend.run(torch.zeros(2, 2, D, dtype=torch.float16), cache, cache)
    run = w.runs[0]
    assert run["k"].shape == (8, 4, 2, D) and run["k"].data_ptr() == cache.data_ptr()  # a view, never a copy
    assert run["k_scale"] is None and run["v_scale"] is None and run["return_lse"] is False
    assert out.shape == (2, 2, D)


def test_decode_uses_tensor_cores_for_groups_of_four_or_fp8_kv(fake_flashinfer: type[FakeFlashInfer]) -> None:
    backend = FlashInferBackend("cpu")
    meta = _csr([5], 4)
    backend.plan(meta, num_qo_heads=8, num_kv_heads=2, head_dim=D, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    assert backend.kernel == "decode_tc"
    backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, q_dtype=torch.bfloat16,
                 kv_dtype=torch.float8_e4m3fn)
    assert backend.kernel == "decode_tc"
    backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    assert backend.kernel == "decode"
    assert [w.init["use_tensor_cores"] for w in fake_flashinfer.wrappers] == [True, False]  # one wrapper per kernel
    assert len(fake_flashinfer.wrappers[0].plans) == 2


def test_fp8_scales_reach_the_kernel(fake_flashinfer: type[FakeFlashInfer]) -> None:
    backend = FlashInferBackend("cpu")
    backend.plan(_csr([5], 4), num_qo_heads=2, num_kv_heads=1, head_dim=D, q_dtype=torch.bfloat16,
                 kv_dtype=torch.float8_e4m3fn)
    cache = _cache(8, 4, 1, D, torch.float8_e4m3fn)
    backend.run(torch.zeros(1, 2, D, dtype=torch.bfloat16), cache, cache, k_scale=0.5, v_scale=2.0)
    run = fake_flashinfer.wrappers[0].runs[0]
    assert (run["k_scale"], run["v_scale"]) == (0.5, 2.0)
    assert fake_flashinfer.wrappers[0].plans[0]["kv_data_type"] == torch.float8_e4m3fn


def test_prefill_plans_causal_ragged_windows(fake_flashinfer: type[FakeFlashInfer]) -> None:
    backend = FlashInferBackend("cpu")
    meta = _csr([7, 12], 4)
    qo = torch.tensor([0, 3, 5], dtype=torch.int32)
    backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, qo_indptr=qo, logits_soft_cap=30.0,
                 q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    assert backend.kernel == "prefill"
    (w,) = fake_flashinfer.wrappers
    plan = w.plans[0]
    assert plan["qo_indptr"].tolist() == [0, 3, 5] and plan["qo_indptr"].device.type == "cpu"  # read on the host
    assert plan["causal"] is True and plan["logits_soft_cap"] == 30.0
    assert w.init["backend"] == "fa2" and w.init["use_cuda_graph"] is False
    cache = _cache(12, 4, 2, D, torch.bfloat16)
    out, lse = backend.run(torch.zeros(5, 4, D, dtype=torch.bfloat16), cache, cache, return_lse=True)
    assert out.shape == (5, 4, D) and lse.shape == (5, 4)
    with pytest.raises(ValueError, match=r"q must be \[total_q, Hq, D\]"):
        backend.run(torch.zeros(4, 4, D, dtype=torch.bfloat16), cache, cache)
    with pytest.raises(ValueError, match="plan is for torch.bfloat16"):
        backend.run(torch.zeros(5, 4, D, dtype=torch.float16), cache, cache)
    with pytest.raises(ValueError, match="KV is torch.float16"):
        backend.run(torch.zeros(5, 4, D, dtype=torch.bfloat16), cache.half(), cache.half())
    backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, qo_indptr=qo.long(), q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16)
    assert w.plans[-1]["qo_indptr"].dtype == torch.int32 and w.plans[-1]["qo_indptr"].tolist() == [0, 3, 5]


def test_a_token_tree_mask_reaches_the_prefill_plan(fake_flashinfer: type[FakeFlashInfer]) -> None:
    """A custom mask goes to FlashInfer's prefill ``plan`` (not causal); the stand-in's attention under it equals
    the reference backend's; a mask without query windows is refused."""
    from smile_llm.attention.torch.backend import TorchBackend
    from smile_llm.speculative.draft_tree import DraftTree, window_mask

    tree = DraftTree(torch.zeros(2, 3, dtype=torch.int64), np.array([[0, 0, 1], [0, 1, 1]]))
    meta = _csr([9, 14], 4)
    qo = torch.tensor([0, 4, 8], dtype=torch.int32)
    mask = window_mask(tree, np.array([5, 10]))
    backend = FlashInferBackend("cpu")
    backend.plan(meta, num_qo_heads=2, num_kv_heads=1, head_dim=D, qo_indptr=qo, q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16, custom_mask=mask)
    (w,) = fake_flashinfer.wrappers
    plan = w.plans[0]
    assert plan["causal"] is False and torch.equal(plan["custom_mask"], mask)
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(16 * 4, 1, D, generator=gen).to(torch.bfloat16)
    q = torch.randn(8, 2, D, generator=gen).to(torch.bfloat16)
    got = backend.run(q, cache, cache.flip(0))
    ref = TorchBackend()
    ref.plan(meta, num_qo_heads=2, num_kv_heads=1, head_dim=D, qo_indptr=qo, q_dtype=torch.bfloat16,
             kv_dtype=torch.bfloat16, custom_mask=mask)
    torch.testing.assert_close(got, ref.run(q, cache, cache.flip(0)))
    with pytest.raises(ValueError, match="custom_mask needs qo_indptr"):
        backend.plan(meta, num_qo_heads=2, num_kv_heads=1, head_dim=D, q_dtype=torch.bfloat16,
                     kv_dtype=torch.bfloat16, custom_mask=mask)


def test_rows_that_see_no_key_come_out_zero_with_minus_inf_lse(fake_flashinfer: type[FakeFlashInfer]) -> None:
    backend = FlashInferBackend("cpu")
    cache = _cache(8, 4, 1, D, torch.float16)
    backend.plan(_csr([5, 0, 3], 4), num_qo_heads=1, num_kv_heads=1, head_dim=D, q_dtype=torch.float16,
                 kv_dtype=torch.float16)
    out, lse = backend.run(torch.zeros(3, 1, D, dtype=torch.float16), cache, cache, return_lse=True)
    # an empty row is written as zeros, not computed: exact
    assert torch.equal(out[1], torch.zeros(1, D, dtype=torch.float16)) and lse[1].item() == float("-inf")
    assert out[[0, 2]].isfinite().all() and lse[[0, 2]].isfinite().all()  # real rows: what the kernel wrote

    qo = torch.tensor([0, 2, 6], dtype=torch.int32)  # row 1: 4 queries over 3 keys; its first sees none
    backend.plan(_csr([5, 3], 4), num_qo_heads=1, num_kv_heads=1, head_dim=D, qo_indptr=qo, q_dtype=torch.float16,
                 kv_dtype=torch.float16)
    out = backend.run(torch.zeros(6, 1, D, dtype=torch.float16), cache, cache)
    assert out[2].eq(0).all() and out[[0, 1, 3, 4, 5]].isfinite().all()


def test_verify_graph_backend_wraps_the_fixed_buffers(fake_flashinfer: type[FakeFlashInfer]) -> None:
    meta = _csr([9, 14], 4)
    qo = torch.tensor([0, 3, 6], dtype=torch.int32)
    backend = FlashInferBackend("cpu", use_cuda_graph=True, fixed_meta=meta, fixed_qo_indptr=qo)
    assert fake_flashinfer.wrappers == []  # made at the first plan, outside capture
    backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    (w,) = fake_flashinfer.wrappers
    assert w.init["use_cuda_graph"] is True and w.init["qo_indptr"] is qo
    assert w.init["indptr"] is meta.indptr and w.init["indices"] is meta.indices
    assert w.init["last"] is meta.last_page_len
    assert w.plans[0]["qo_indptr"].tolist() == qo.tolist()  # qo_indptr defaults to the fixed one (read on the host)
    assert backend.is_bound_to(meta) and not backend.is_bound_to(_csr([9, 14], 4))
    other = _csr([9, 14], 4)
    other.indices.fill_(1)
    with pytest.raises(ValueError, match="FlashInfer would copy another one over it"):
        backend.plan(other, num_qo_heads=4, num_kv_heads=2, head_dim=D, q_dtype=torch.bfloat16,
                     kv_dtype=torch.bfloat16)
    assert meta.indices.tolist() == [3, 4, 5, 6, 7, 8, 9, 10]  # the fixed CSR was not overwritten
    with pytest.raises(ValueError, match="fixed qo_indptr"):
        backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, qo_indptr=qo.clone(),
                     q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)

    meta.last_page_len.copy_(torch.tensor([2, 3], dtype=torch.int32))  # the pool rewrites in place: plan again
    backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, qo_indptr=qo, q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16)
    assert len(fake_flashinfer.wrappers) == 1 and len(w.plans) == 2
    with pytest.raises(ValueError, match="build another backend"):
        backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, q_dtype=torch.bfloat16,
                     kv_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cannot serve this plan: torch.float32 queries"):
        backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, q_dtype=torch.float32, kv_dtype=torch.float32)


def test_decode_graph_backend_refuses_rows_without_keys_and_query_windows(fake_flashinfer: type[FakeFlashInfer]) -> None:
    meta = _csr([9, 14], 4)
    backend = FlashInferBackend("cpu", use_cuda_graph=True, fixed_meta=meta)
    with pytest.raises(ValueError, match="built for decode"):
        backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, qo_indptr=torch.tensor([0, 1, 2]).int(),
                     q_dtype=torch.float16, kv_dtype=torch.float16)
    with pytest.raises(ValueError, match="plan it with that CSR"):
        backend.plan(_csr([9, 14], 4), num_qo_heads=2, num_kv_heads=2, head_dim=D, q_dtype=torch.float16,
                     kv_dtype=torch.float16)
    meta.indptr[2], meta.last_page_len[1] = 3, 0  # row 1 empty, in place
    with pytest.raises(ValueError, match="see no key"):
        backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, q_dtype=torch.float16, kv_dtype=torch.float16)
    meta.indptr[2], meta.last_page_len[1] = 7, 2
    backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, q_dtype=torch.float16, kv_dtype=torch.float16)
    (w,) = fake_flashinfer.wrappers
    assert w.init["use_cuda_graph"] is True and w.init["indptr"] is meta.indptr and w.init["backend"] == "fa2"
    with pytest.raises(ValueError, match="batch size should be fixed"):  # the stand-in is as strict as FlashInfer
        w.plan(meta.indptr[:2], meta.indices, meta.last_page_len[:1], 2, 2, D, 4)


def test_kernel_family_follows_the_compute_capability(fake_flashinfer: type[FakeFlashInfer],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    hopper, ampere = (9, 0), (8, 0)
    assert default_kernel_backend("prefill", hopper, torch.bfloat16, torch.bfloat16, D) == "fa3"
    assert default_kernel_backend("prefill", hopper, torch.bfloat16, torch.float8_e4m3fn, D) == "fa2"  # no mixed fa3
    assert default_kernel_backend("prefill", hopper, torch.bfloat16, torch.bfloat16, D, custom_mask=True) == "fa2"
    assert default_kernel_backend("prefill", hopper, torch.bfloat16, torch.bfloat16, 96) == "fa2"  # fa3: 64/128/256
    assert default_kernel_backend("decode_tc", hopper, torch.bfloat16, torch.bfloat16, D) == "fa2"
    assert default_kernel_backend("prefill", ampere, torch.bfloat16, torch.bfloat16, D) == "fa2"
    assert default_kernel_backend("prefill", None, torch.bfloat16, torch.bfloat16, D) == "fa2"
    monkeypatch.setattr(fi_backend, "compute_capability", lambda device: hopper)
    backend = FlashInferBackend("cpu")
    qo = torch.tensor([0, 3, 5], dtype=torch.int32)
    for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.bfloat16):
        backend.plan(_csr([7, 12], 4), num_qo_heads=4, num_kv_heads=2, head_dim=D, qo_indptr=qo,
                     q_dtype=torch.bfloat16, kv_dtype=kv_dtype)
    assert [w.init["backend"] for w in fake_flashinfer.wrappers] == ["fa3", "fa2"]  # one wrapper per family
    assert len(fake_flashinfer.wrappers[0].plans) == 2
    forced = FlashInferBackend("cpu", kernel_backend="fa2")
    forced.plan(_csr([7, 12], 4), num_qo_heads=4, num_kv_heads=2, head_dim=D, qo_indptr=qo, q_dtype=torch.bfloat16,
                kv_dtype=torch.bfloat16)
    assert fake_flashinfer.wrappers[-1].init["backend"] == "fa2"


def test_float32_falls_back_to_the_reference_kernel(fake_flashinfer: type[FakeFlashInfer]) -> None:
    from smile_llm.attention import paged_attention

    backend = FlashInferBackend("cpu")
    meta = _csr([5, 7], 4)
    qo = torch.tensor([0, 2, 5], dtype=torch.int32)
    backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=D, qo_indptr=qo)  # protocol default dtypes: fp32
    assert backend.kernel == "reference" and fake_flashinfer.wrappers == []
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for shape in ((5, 4, D), (40, 2, D), (40, 2, D)))
    for _ in range(2):  # every layer shares the plan
        out, lse = backend.run(q, k, v, k_scale=0.5, v_scale=2.0, return_lse=True)
        want, want_lse = paged_attention(q, k, v, meta, qo_indptr=qo, k_scale=0.5, v_scale=2.0, return_lse=True)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)  # the same plan and kernels on the same inputs


def test_bad_arguments_raise_value_errors(fake_flashinfer: type[FakeFlashInfer]) -> None:
    backend = FlashInferBackend("cpu")
    with pytest.raises(RuntimeError, match="before plan"):
        backend.run(torch.zeros(1, 1, D), torch.zeros(4, 1, D), torch.zeros(4, 1, D))
    meta = _csr([5], 4)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        backend.plan(meta, num_qo_heads=3, num_kv_heads=2, head_dim=D)
    with pytest.raises(ValueError, match="num_qo_heads must be a positive int"):
        backend.plan(meta, num_qo_heads=0, num_kv_heads=2, head_dim=D)
    bad = FlashInferKvMetadata(meta.indptr, meta.indices, torch.tensor([5], dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="last_page_len 5"):  # FlashInfer would accept it (its issue 320)
        backend.plan(bad, num_qo_heads=2, num_kv_heads=2, head_dim=D)
    with pytest.raises(ValueError, match="qo_indptr must hold"):
        backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, qo_indptr=torch.tensor([0, 2, 3]).int())
    with pytest.raises(ValueError, match="use_cuda_graph=True"):
        FlashInferBackend("cpu", fixed_meta=meta)
    with pytest.raises(ValueError, match="needs fixed_meta"):
        FlashInferBackend("cpu", use_cuda_graph=True)
    backend.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=D, q_dtype=torch.float16, kv_dtype=torch.float16)
    with pytest.raises(ValueError, match="k_layer has shape"):
        backend.run(torch.zeros(1, 2, D, dtype=torch.float16), torch.zeros(6, 2, D).half(), torch.zeros(6, 2, D).half())
