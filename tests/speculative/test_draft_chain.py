"""DraftChain: a draft round's chained steps planned once, their K/V kept out of the pool. Every step must equal
the same step run as a one-token forward through the pool (``Transformer.draft`` for an MTP head, the model's
forward for a draft model), on rows of different history lengths, for a dense and a hybrid (gated-attention) MTP
head and a whole draft model; the pool must be left exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.attention.backend import select_backend
from smile_llm.attention.flashinfer import flashinfer_available
from smile_llm.cache import KvCachePool
from smile_llm import DEFAULT_DRAFT_DIR, LanguageModel
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer
from smile_llm.speculative.draft_chain import DraftChain

from tests.models.mtp_models import build_mtp_model, load

HISTORY = [5, 9, 2]  # each row's MTP history length when the chain starts
STEPS = 5


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Transformer]:
    dense = load(build_mtp_model(tmp_path_factory.mktemp("chain"), "qwen3", seed=5))
    return {"qwen3": dense.transformer, "hybrid": LanguageModel.default("hybrid").transformer}


def history_pool(tr: Transformer, page_size: int, seed: int) -> tuple[KvCachePool, list[int]]:
    """An MTP pool whose rows hold HISTORY positions of seeded random (token, hidden) inputs, written by
    ``Transformer.draft`` one row at a time; room for STEPS more positions per row. On the model's device, in its
    dtype."""
    c = tr.config
    device = tr.model.embed_tokens.weight.device
    pool = KvCachePool(c.mtp_num_hidden_layers, 128, c.num_key_value_heads, c.head_dim, page_size, device=device,
                       dtype=tr.dtype)
    pool.prefix_reuse_enabled = False
    ids = [pool.bind_request([], n + STEPS) for n in HISTORY]
    g = torch.Generator().manual_seed(seed)
    backend = select_backend(device)
    for rid, n in zip(ids, HISTORY):
        pool.activate_step(rid)
        tokens = torch.randint(0, c.vocab_size, (1, n), generator=g).to(device)
        hidden = torch.randn(1, n, c.hidden_size, generator=g).to(device, tr.dtype)
        tr.draft(tokens, hidden, np.array([0]), pool, backend)
    pool.activate_step(*ids)
    return pool, ids


def lead(logits: torch.Tensor) -> torch.Tensor:
    """How far each row's top logit leads its second (float32)."""
    top = logits.float().topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def snapshot(pool: KvCachePool, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's K and V of every row's written positions."""
    out = []
    for rid, n in zip(ids, HISTORY):
        pool.activate_step(rid)
        out += [tuple(t.clone() for t in pool.get(layer, n)) for layer in range(pool.num_layers)]
    pool.activate_step(*ids)
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("name", ["qwen3", "hybrid"])
def test_chain_steps_equal_one_token_forwards_through_the_pool(models, name: str, page_size: int) -> None:
    tr = models[name]
    c = tr.config
    backend = select_backend(torch.device("cpu"))
    through_pool, pool_ids = history_pool(tr, page_size, seed=1)
    chained, chain_ids = history_pool(tr, page_size, seed=1)
    before = snapshot(chained, chain_ids)
    start = np.array(HISTORY, dtype=np.int64)
    chain = DraftChain(tr, chained, select_backend(torch.device("cpu")), start, STEPS)  # its own backend
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, c.vocab_size, (3, 1), generator=g)
    hidden = torch.randn(3, 1, c.hidden_size, generator=g, dtype=tr.dtype)
    for j in range(STEPS):
        want = tr.draft(tokens, hidden, start + j, through_pool, backend)
        got = chain.step(tokens, hidden)
        assert (got.logits - want.logits).abs().max().item() < 1e-5, j
        assert (got.hidden - want.hidden).abs().max().item() < 1e-5, j
        # implied by the bound wherever the top logit leads by 2e-5; on these seeded inputs it leads by >= 0.018
        assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
        tokens, hidden = want.logits.argmax(-1, keepdim=True), want.hidden[:, None]  # the chain's own inputs
    with pytest.raises(RuntimeError, match="5 steps, all run"):
        chain.step(tokens, hidden)
    # Nothing of the chain reached the pool: kv_len, the rows' K/V and the pool's invariants are as before.
    assert [chained.kv_len(i) for i in chain_ids] == HISTORY
    for (k0, v0), (k1, v1) in zip(before, snapshot(chained, chain_ids)):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    chained.check_invariants()
    assert [through_pool.kv_len(i) for i in pool_ids] == [n + STEPS for n in HISTORY]


def model_history_pool(tr: Transformer, seed: int) -> tuple[KvCachePool, list[int]]:
    """A pool of ``tr``'s own layers whose rows hold HISTORY positions of seeded random tokens (a draft model's
    pool), written by plain forwards one row at a time; room for STEPS more positions per row."""
    c = tr.config
    pool = KvCachePool(c.num_hidden_layers, 128, c.num_key_value_heads, c.head_dim, 4)
    pool.prefix_reuse_enabled = False
    ids = [pool.bind_request([], n + STEPS) for n in HISTORY]
    g = torch.Generator().manual_seed(seed)
    for rid, n in zip(ids, HISTORY):
        pool.activate_step(rid)
        tr(torch.randint(0, c.vocab_size, (1, n), generator=g), np.array([0]), pool, select_backend("cpu"))
    pool.activate_step(*ids)
    return pool, ids


def test_a_draft_models_chain_equals_one_token_forwards() -> None:
    """``DraftChain.forward``: the shipped draft model's whole stack, chained over its pool's history, equals one-token
    forwards through the pool (logits within 1e-5), and writes nothing."""
    tr = LanguageModel.from_pretrained(DEFAULT_DRAFT_DIR, drafter=None).transformer
    through_pool, _ = model_history_pool(tr, seed=3)
    chained, chain_ids = model_history_pool(tr, seed=3)
    start = np.array(HISTORY, dtype=np.int64)
    chain = DraftChain(tr, chained, select_backend("cpu"), start, STEPS)
    tokens = torch.tensor([[10], [20], [30]])
    backend = select_backend("cpu")
    for j in range(STEPS):
        want = tr(tokens, start + j, through_pool, backend)
        got = chain.forward(tokens)
        assert got.logits.shape == want.logits.shape == (3, 1, tr.config.vocab_size)
        assert (got.logits - want.logits).abs().max().item() < 1e-5, j
        tokens = want.logits[:, -1].argmax(-1, keepdim=True)
    assert [chained.kv_len(i) for i in chain_ids] == HISTORY
    chained.check_invariants()


def test_a_chain_needs_a_step_and_an_mtp_head(models) -> None:
    tr = models["qwen3"]
    backend = select_backend(torch.device("cpu"))
    pool, _ = history_pool(tr, 4, seed=0)
    with pytest.raises(ValueError, match="steps >= 1"):
        DraftChain(tr, pool, backend, np.array(HISTORY), 0)
    head = tr.mtp
    try:
        tr.mtp = None
        chain = DraftChain(tr, pool, backend, np.array(HISTORY), 2)
        with pytest.raises(RuntimeError, match="no MTP head"):
            chain.step(torch.zeros(3, 1, dtype=torch.int64), torch.zeros(3, 1, tr.config.hidden_size))
    finally:
        tr.mtp = head


CUDA_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 257, "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
               "head_dim": 128, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
               "tie_word_embeddings": True, "mtp_num_hidden_layers": 1}


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                    reason="needs a CUDA device and flashinfer (pip install -e '.[gpu]')")
def test_chain_steps_equal_one_token_forwards_with_flashinfer() -> None:
    """On CUDA in bf16: the chain's history through FlashInfer's decode with its LSE, merged with the chain part in
    plain matmuls, against one-token FlashInfer forwards through the pool (bf16 tolerance, same argmax)."""
    torch.manual_seed(0)
    tr = Transformer(ModelConfig.from_dict(CUDA_CONFIG)).to("cuda", torch.bfloat16)
    c = tr.config
    through_pool, _ = history_pool(tr, 4, seed=1)
    chained, chain_ids = history_pool(tr, 4, seed=1)
    backend, chain_backend = select_backend("cuda"), select_backend("cuda")
    assert backend.name == chain_backend.name == "flashinfer"
    start = np.array(HISTORY, dtype=np.int64)
    chain = DraftChain(tr, chained, chain_backend, start, STEPS)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, c.vocab_size, (3, 1), generator=g).cuda()
    hidden = torch.randn(3, 1, c.hidden_size, generator=g).to("cuda", torch.bfloat16)
    for j in range(STEPS):
        want = tr.draft(tokens, hidden, start + j, through_pool, backend)
        got = chain.step(tokens, hidden)
        assert (got.logits - want.logits).abs().max().item() < 0.1, j
        clear = lead(want.logits) > 0.2  # a lead the 0.1 bound cannot overturn: there the choices must agree
        assert torch.equal(got.logits.argmax(-1)[clear], want.logits.argmax(-1)[clear]), j
        tokens, hidden = want.logits.argmax(-1, keepdim=True), want.hidden[:, None]
    assert [chained.kv_len(i) for i in chain_ids] == HISTORY
