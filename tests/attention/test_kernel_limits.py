"""FlashInfer's kernel limits, the choice of backend per model, and token-tree plans on a (simulated) GPU, on CPU.

FlashInfer's prefill kernels run head dims 64, 128 and 256 only (fa2 rejects smaller ones as an invalid
configuration, fa3 is built for those three), fa3 has no custom mask and no mixed query/KV dtypes, and a custom
mask's plan does arithmetic on ``qo_indptr`` and the paged CSR together. The stand-in of ``tests/flashinfer_fake.py``
refuses each of these where the real library does, and ``simulate_cuda`` gives it a ``cuda:0`` whose tensors refuse
to mix with host ones; so every test here fails as the first GPU run would if the backend crossed a limit.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

import smile_llm.attention.flashinfer as fi_backend
import smile_llm.language_model as language_model
from smile_llm.attention import FlashInferBackend, select_backend
from smile_llm.attention.backend import AttentionShape
from smile_llm.attention.flashinfer_limits import kernel_limit, model_limit
from smile_llm.attention.torch.backend import TorchBackend, paged_attention
from smile_llm.cache.metadata import FlashInferKvMetadata
from smile_llm.language_model import LanguageModel
from smile_llm.speculative.draft_tree import DraftTree, window_mask

from ..flashinfer_fake import FakeDecode, FakeFlashInfer, FakePrefill, OnDevice, install, simulate_cuda
from .cases import assert_close

BF16, FP16, FP32, FP8 = torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn
SHIPPED = AttentionShape(32, 4, 2, BF16, BF16)  # the default dense, hybrid and draft models on CUDA


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeFlashInfer]:
    return install(monkeypatch)


def _csr(lengths: list[int], page_size: int) -> FlashInferKvMetadata:
    """Rows on consecutive pages from page 3 on (host tensors)."""
    pages = [-(-n // page_size) for n in lengths]
    indptr = np.concatenate([[0], np.cumsum(pages)])
    as32 = lambda xs: torch.tensor(np.asarray(xs), dtype=torch.int32)  # noqa: E731
    return FlashInferKvMetadata(as32(indptr), as32(np.arange(3, 3 + indptr[-1])),
                                as32([(n - 1) % page_size + 1 for n in lengths]), page_size)


def _on(meta: FlashInferKvMetadata, device: str) -> FlashInferKvMetadata:
    return FlashInferKvMetadata(meta.indptr.to(device), meta.indices.to(device), meta.last_page_len.to(device),
                                meta.page_size)


def _tree_case(device: str, head_dim: int = 64) -> dict[str, Any]:
    """A two-row token-tree verify window (root plus 3 nodes each) over 9 and 14 cached positions, with seeded
    queries and a paged cache of 16 pages of 4 slots, everything but the mask on ``device``."""
    tree = DraftTree(torch.zeros(2, 3, dtype=torch.int64), np.array([[0, 0, 1], [0, 1, 1]]))
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(16 * 4, 1, head_dim, generator=gen).to(BF16)
    return {"meta": _on(_csr([9, 14], 4), device), "qo": torch.tensor([0, 4, 8], dtype=torch.int32).to(device),
            "mask": window_mask(tree, np.array([5, 10])),  # on the host, as Transformer.context makes it
            "q": torch.randn(8, 2, head_dim, generator=gen).to(BF16).to(device),
            "k": cache.to(device), "v": cache.flip(0).to(device), "head_dim": head_dim}


def _plan_tree(backend: Any, case: dict[str, Any]) -> None:
    backend.plan(case["meta"], num_qo_heads=2, num_kv_heads=1, head_dim=case["head_dim"], qo_indptr=case["qo"],
                 causal=False, q_dtype=BF16, kv_dtype=BF16, custom_mask=case["mask"])


def _reference_tree(case: dict[str, Any]) -> torch.Tensor:
    ref = TorchBackend()
    _plan_tree(ref, case)
    return ref.run(case["q"], case["k"], case["v"])


def _assert_same_tree_attention(got: torch.Tensor, want: torch.Tensor) -> None:
    """The stand-in's attention (it asks for the LSE: the online softmax or the fused kernel that returns it) against
    the reference backend's (SDPA): two float32 computations that differ by a few fp32 eps, each rounded to bfloat16,
    so a value near a rounding boundary can land one bf16 ulp (at most eps = 2^-7 of it) away (on AVX2, not AVX-512).
    ``assert_close`` allows 2 bf16 eps plus 32 fp32 eps of the largest magnitude (at least 1): a rounding, never a
    wrong mask or a wrong row."""
    assert_close(got.cpu(), want.cpu(), BF16)


# ------------------------------------------------------------------------------------------------ the limits
def _why(kernel: str, family: str = "fa2", *, head_dim: int = 64, group: int = 1, q: torch.dtype = BF16,
         kv: torch.dtype = BF16, mask: bool = False) -> str:
    """``kernel_limit``'s answer, "None" when the kernel serves the plan."""
    return str(kernel_limit(kernel, family, head_dim=head_dim, group=group, q_dtype=q, kv_dtype=kv, custom_mask=mask))


def test_kernel_limit_names_each_limit_of_each_kernel() -> None:
    for d in (64, 128, 256):
        for kernel in ("prefill", "decode_tc", "decode"):
            assert _why(kernel, head_dim=d, group=2) == "None"
        assert _why("prefill", "fa3", head_dim=d, group=8, q=FP16, kv=FP16) == "None"
    for d in (16, 32, 48, 96, 512):  # the prefill kernels: 64, 128, 256
        assert f"head dim {d}" in _why("prefill", head_dim=d) and f"head dim {d}" in _why("decode_tc", head_dim=d)
    # the CUDA-core decode serves 32 (its own limits: a power of two, lanes for its two pipeline stages)
    assert _why("decode", head_dim=32, group=2) == "None"
    assert "head dim 16" in _why("decode", head_dim=16, kv=FP8) and "head dim 96" in _why("decode", head_dim=96)
    assert "5 query heads per KV head" in _why("decode", group=5)
    # dtypes
    assert "float32 queries" in _why("prefill", q=FP32, kv=FP32)
    assert "over torch.bfloat16 KV" in _why("prefill", q=FP16, kv=BF16)
    assert _why("prefill", kv=FP8) == "None"
    # fa3: no FP8 KV under half queries, no custom mask; fa2 has custom masks
    assert "fa3 over torch.float8_e4m3fn KV" in _why("prefill", "fa3", head_dim=128, kv=FP8)
    assert "custom mask on fa3" in _why("prefill", "fa3", head_dim=128, mask=True)
    assert _why("prefill", head_dim=128, mask=True) == "None"
    # every limit that applies, named
    both = _why("prefill", "fa3", head_dim=32, q=FP32, kv=FP32, mask=True)
    assert all(part in both for part in ("head dim 32", "float32 queries", "custom mask on fa3"))
    with pytest.raises(ValueError, match="family"):
        _why("prefill", "cudnn")


def test_model_limit_checks_every_kernel_a_model_plans() -> None:
    assert "head dim 32" in str(SHIPPED.flashinfer_limit())  # prefill at 32 is invalid, whatever the decode can do
    assert AttentionShape(128, 8, 2, BF16, BF16).flashinfer_limit() is None  # tensor-core decode, fa2 prefill
    assert AttentionShape(64, 2, 2, FP16, FP8).flashinfer_limit() is None  # FP8 KV: tensor-core decode
    assert AttentionShape(128, 2, 2, BF16, BF16).flashinfer_limit() is None  # CUDA-core decode
    fp32 = model_limit(head_dim=32, num_qo_heads=4, num_kv_heads=2, q_dtype=FP32, kv_dtype=FP32)
    assert fp32 is not None and "float32 queries" in fp32 and "head dim 32" in fp32
    assert fp32.count("float32 queries") == 1  # each reason once, though both kernels have it
    with pytest.raises(ValueError, match="multiple"):
        model_limit(head_dim=64, num_qo_heads=3, num_kv_heads=2, q_dtype=BF16, kv_dtype=BF16)


def test_the_stand_in_refuses_what_flashinfer_refuses(fake: type[FakeFlashInfer]) -> None:
    """The stand-in's own refusals, each where the real library raises it."""
    meta = _csr([5, 9], 4)
    qo = torch.tensor([0, 2, 5], dtype=torch.int32)
    ws = torch.zeros(8, dtype=torch.uint8)
    cache32 = torch.zeros(16, 4, 1, 32, dtype=BF16)
    prefill = FakePrefill(ws, "NHD", backend="fa2")  # fa2 at head dim 32: plans, then its dispatch finds no tile
    prefill.plan(qo, meta.indptr, meta.indices, meta.last_page_len, 2, 1, 32, 4, causal=True, q_data_type=BF16)
    with pytest.raises(RuntimeError, match="Invalid configuration"):
        prefill.run(torch.zeros(5, 2, 32, dtype=BF16), (cache32, cache32))
    with pytest.raises(RuntimeError, match="static_assert"):  # fa3 is built for 64, 128 and 256 only
        FakePrefill(ws, "NHD", backend="fa3").plan(qo, meta.indptr, meta.indices, meta.last_page_len, 2, 1, 32, 4,
                                                   q_data_type=BF16)
    with pytest.raises(RuntimeError, match="static_assert"):  # CUDA-core decode at 8: one lane, two stages
        FakeDecode(ws, "NHD").plan(meta.indptr, meta.indices, meta.last_page_len, 2, 2, 8, 4, q_data_type=BF16)
    decode = FakeDecode(ws, "NHD")
    decode.plan(meta.indptr, meta.indices, meta.last_page_len, 5, 1, 64, 4, q_data_type=BF16)
    cache64 = torch.zeros(16, 4, 1, 64, dtype=BF16)
    with pytest.raises(RuntimeError, match="Unsupported group_size: 5"):
        decode.run(torch.zeros(2, 5, 64, dtype=BF16), (cache64, cache64))


# ------------------------------------------------------------------------------------------------ per plan
def test_an_eager_plan_beyond_the_kernels_runs_the_reference(fake: type[FakeFlashInfer]) -> None:
    """Head dim 32 prefill: FlashInfer would fail at run ("Invalid configuration"); the eager backend plans the
    reference instead and returns its output."""
    backend = FlashInferBackend("cpu")
    meta = _csr([7, 12], 4)
    qo = torch.tensor([0, 3, 5], dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(5, 4, 32, generator=gen).to(BF16)
    k, v = (torch.randn(64, 2, 32, generator=gen).to(BF16) for _ in range(2))
    backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=32, qo_indptr=qo, q_dtype=BF16, kv_dtype=BF16)
    assert backend.kernel == "reference" and fake.wrappers == []
    want = paged_attention(q, k, v, meta, qo_indptr=qo)
    assert torch.equal(backend.run(q, k, v), want)  # the fallback is this very call: same plan, same kernels


def test_a_graph_plan_beyond_the_kernels_is_refused_by_name(fake: type[FakeFlashInfer]) -> None:
    meta = _csr([9, 14], 4)
    qo = torch.tensor([0, 3, 6], dtype=torch.int32)
    backend = FlashInferBackend("cpu", use_cuda_graph=True, fixed_meta=meta, fixed_qo_indptr=qo)
    with pytest.raises(ValueError, match="cannot serve this plan: head dim 32.*graph mode cannot fall back"):
        backend.plan(meta, num_qo_heads=4, num_kv_heads=2, head_dim=32, q_dtype=BF16, kv_dtype=BF16)
    assert fake.wrappers == []


def test_a_forced_kernel_family_applies_to_plain_prefill_plans(fake: type[FakeFlashInfer]) -> None:
    with pytest.raises(ValueError, match="kernel_backend must be"):
        FlashInferBackend("cpu", kernel_backend="cudnn")
    forced = FlashInferBackend("cpu", kernel_backend="fa3")
    meta = _csr([7, 12], 4)
    forced.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=64, q_dtype=BF16, kv_dtype=BF16)
    assert forced.kernel == "decode"  # decode stays on fa2, a kernel and not the reference
    forced.plan(meta, num_qo_heads=2, num_kv_heads=2, head_dim=64, qo_indptr=torch.tensor([0, 2, 5]).int(),
                q_dtype=BF16, kv_dtype=BF16)
    assert forced.kernel == "prefill"
    assert [w.init["backend"] for w in fake.wrappers] == ["fa2", "fa3"]


# ------------------------------------------------------------------------------------------------ per model
def test_select_backend_falls_back_per_model_with_one_warning(fake: type[FakeFlashInfer],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU with FlashInfer: a model FlashInfer cannot serve gets the reference and one warning naming why; one
    it can serve gets FlashInfer and no warning; forcing FlashInfer for the first is refused by name."""
    simulate_cuda(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = select_backend("cuda", shape=SHIPPED)
    assert isinstance(backend, TorchBackend)
    assert len(caught) == 1 and caught[0].category is RuntimeWarning
    assert "head dim 32" in str(caught[0].message) and "reference" in str(caught[0].message)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = select_backend("cuda", shape=AttentionShape(128, 8, 2, BF16, BF16))
    assert isinstance(backend, FlashInferBackend) and caught == []
    with pytest.raises(ValueError, match="head dim 32"):
        select_backend("cuda", prefer="flashinfer", shape=SHIPPED)
    assert isinstance(select_backend("cuda"), FlashInferBackend)  # no shape: nothing to check


def test_from_pretrained_chooses_with_the_models_attention_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LanguageModel.from_pretrained`` hands the choice its model's head dim, heads and dtypes (the pool's
    storage dtype for the KV)."""
    seen: list[tuple[Any, Any]] = []

    def spy(device: Any, prefer: str | None = None, *, shape: AttentionShape | None = None) -> Any:
        seen.append((torch.device(device), shape))
        return select_backend(device, prefer, shape=shape)

    monkeypatch.setattr(language_model, "select_backend", spy)
    lm = LanguageModel.default(drafter=None, max_seq_len=64, max_batch_size=1)
    try:
        assert seen == [(torch.device("cpu"), AttentionShape(32, 4, 2, FP32, FP32))]
        assert lm.generate("import os\n", 4, speculative_tokens=0).tokens  # the chosen backend serves it
    finally:
        lm.close()


# ------------------------------------------------------------------------------------------------ token trees
def test_a_tree_plan_hands_flashinfer_qo_indptr_on_the_csrs_device(fake: type[FakeFlashInfer],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU (Ampere: fa2) with the CSR and ``qo_indptr`` on the device, a token-tree plan reaches FlashInfer's
    mask arithmetic with all three on one device, and its attention equals the reference's."""
    with simulate_cuda(monkeypatch, capability=(8, 0)):
        case = _tree_case("cuda")
        assert isinstance(case["meta"].indptr, OnDevice) and case["meta"].indptr.device.type == "cuda"
        backend = FlashInferBackend("cuda")
        _plan_tree(backend, case)
        (w,) = fake.wrappers
        plan = w.plans[0]
        assert w.init["backend"] == "fa2" and plan["causal"] is False
        assert {plan[n].device.type for n in ("qo_indptr", "indptr", "last")} == {"cuda"}
        assert plan["custom_mask"].device.type == "cuda" and plan["custom_mask"].dtype == torch.bool
        got, want = backend.run(case["q"], case["k"], case["v"]), _reference_tree(case)
        assert got.device.type == "cuda"
        _assert_same_tree_attention(got, want)


def test_a_tree_plan_takes_fa2_on_hopper(fake: type[FakeFlashInfer], monkeypatch: pytest.MonkeyPatch) -> None:
    """Compute capability 9.x: plain prefill plans take fa3, a token tree's custom-mask plan fa2 (fa3 has no
    custom masks; the stand-in, like FlashInfer, fails such a run)."""
    monkeypatch.setattr(fi_backend, "compute_capability", lambda device: (9, 0))
    case = _tree_case("cpu")
    backend = FlashInferBackend("cpu")
    _plan_tree(backend, case)
    _assert_same_tree_attention(backend.run(case["q"], case["k"], case["v"]), _reference_tree(case))
    backend.plan(case["meta"], num_qo_heads=2, num_kv_heads=1, head_dim=64, qo_indptr=case["qo"], q_dtype=BF16,
                 kv_dtype=BF16)
    assert [w.init["backend"] for w in fake.wrappers] == ["fa2", "fa3"]
    assert fake.wrappers[0].plans[0]["custom_mask"] is not None and len(fake.wrappers[1].plans) == 1
    forced = FlashInferBackend("cpu", kernel_backend="fa3")  # forcing fa3 still plans a mask on fa2
    _plan_tree(forced, case)
    assert fake.wrappers[-1].init["backend"] == "fa2"


def test_the_stand_in_refuses_mixed_devices_and_fa3_masks(fake: type[FakeFlashInfer],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """What the two tests above guard against, as FlashInfer reports it: a host ``qo_indptr`` beside a device CSR
    in a mask plan, and a custom mask on fa3."""
    case = _tree_case("cpu")
    mask, meta = case["mask"], case["meta"]
    fa3 = FakePrefill(torch.zeros(8, dtype=torch.uint8), "NHD", backend="fa3")
    fa3.plan(case["qo"], meta.indptr, meta.indices, meta.last_page_len, 2, 1, 64, 4, custom_mask=mask,
             q_data_type=BF16)
    with pytest.raises(RuntimeError, match="cudaErrorNotSupported"):
        fa3.run(case["q"], (case["k"].view(-1, 4, 1, 64), case["v"].view(-1, 4, 1, 64)))
    with simulate_cuda(monkeypatch):
        dev = _tree_case("cuda")
        w = FakePrefill(torch.zeros(8, dtype=torch.uint8, device="cuda"), "NHD", backend="fa2")
        host_qo = dev["qo"].cpu()
        with pytest.raises(RuntimeError, match="same device"):
            w.plan(host_qo, dev["meta"].indptr, dev["meta"].indices, dev["meta"].last_page_len, 2, 1, 64, 4,
                   custom_mask=dev["mask"].to("cuda"), q_data_type=BF16)
        with pytest.raises(RuntimeError, match="same device"):  # the mask is packed on the device
            w.plan(dev["qo"], dev["meta"].indptr, dev["meta"].indices, dev["meta"].last_page_len, 2, 1, 64, 4,
                   custom_mask=dev["mask"], q_data_type=BF16)


def test_the_simulated_device_behaves_as_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    with simulate_cuda(monkeypatch, capability=(8, 6)):
        assert torch.cuda.is_available() and torch.cuda.get_device_capability() == (8, 6)
        host = torch.arange(4)
        dev = host.to("cuda")
        assert dev.device == torch.device("cuda", 0) and dev.is_cuda and not host.is_cuda
        assert (dev + 1).device.type == "cuda" and torch.zeros(2, device="cuda").device.type == "cuda"
        assert dev.data_ptr() != host.data_ptr()  # a transfer copies
        with pytest.raises(RuntimeError, match="same device"):
            dev + host
        assert (dev + torch.tensor(1)).tolist() == [1, 2, 3, 4]  # 0-dim host tensors are fine, as on CUDA
        with pytest.raises(TypeError, match="numpy"):
            dev.numpy()
        back = dev.cpu()
        assert back.device.type == "cpu" and back.tolist() == [0, 1, 2, 3] and back.data_ptr() != dev.data_ptr()
        assert dev[host[:2]].tolist() == [0, 1]  # host indices index a device tensor
