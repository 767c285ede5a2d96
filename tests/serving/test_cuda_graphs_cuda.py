"""CUDA-graph runners against eager forwards on a real model (GPU only: every test is marked ``cuda`` and skipped
without CUDA and flashinfer; ``scripts/gpu_check.sh`` runs them).

A random Qwen3-style model with head dim 128, 2 layers, bf16, an MTP head, page size 4 so sequences cross a page
every few steps. Graph outputs are compared with an eager forward of the same step over the same KV (within bf16
tolerance and with the same argmax: FlashInfer's graph and eager schedules may differ, #2511), and the number of
captures is asserted exactly: one decode graph per batch size and one verify graph per (batch, window), whatever
the rows' lengths. The runners' logic is covered on the CPU by tests/serving/test_cuda_graphs.py; these check the real
capture (side-stream warm-up, shared memory pool, thread-local capture mode) and FlashInfer's graph mode.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from smile_llm.attention.flashinfer import flashinfer_available
from smile_llm.cache import KvCachePool
from smile_llm.language_model import LanguageModel
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and flashinfer_available()),
                       reason="needs a CUDA device and flashinfer (pip install -e '.[gpu]')"),
]

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 257, "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
          "head_dim": 128, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "eos_token_id": 256, "mtp_num_hidden_layers": 1,
          "speculative_config": {"num_speculative_tokens": 3}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("graph_model")
    torch.manual_seed(0)
    tr = Transformer(ModelConfig.from_dict(CONFIG))
    state = {k: v.contiguous() for k, v in tr.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


_live: list[LanguageModel] = []


def load(model_dir, graphs=True, max_batch_size=4):
    """A model whose pool takes SGLang's mem-fraction share of the GPU: one at a time (``close_models``)."""
    close_models()
    lm = LanguageModel.from_pretrained(model_dir, device="cuda", dtype=torch.bfloat16, page_size=4,
                                       max_batch_size=max_batch_size, max_seq_len=256, cuda_graphs=graphs,
                                       mem_fraction=0.5)
    _live.append(lm)
    assert lm.backend.name == "flashinfer"  # head dim 128, bf16: within FlashInfer's kernels, so no fallback
    return lm


def close_models():
    while _live:
        _live.pop().close()
    torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _one_model_at_a_time():
    yield
    close_models()


def assert_close(graph, eager):
    """bf16 logits within 2e-2 + 2e-2 |x|, and the same choice wherever the top logit leads by more than twice
    that (a lead the tolerance cannot overturn; on a random model a near tie may go either way)."""
    torch.testing.assert_close(graph.logits, eager.logits, rtol=2e-2, atol=2e-2)
    top = eager.logits.float().topk(2, dim=-1).values
    clear = top[..., 0] - top[..., 1] > 2 * (2e-2 + 2e-2 * top[..., 0].abs())
    assert torch.equal(graph.logits.argmax(-1)[clear], eager.logits.argmax(-1)[clear])


def test_one_decode_graph_per_batch_size_across_page_boundaries_and_ragged_rows(model_dir):
    lm = load(model_dir)
    runner, tr, pool = lm.runner.decode_graphs, lm.transformer, lm.pool
    ids = []
    for n in (8, 13):
        rid = pool.bind_request(list(range(n)), 100)
        pool.activate_step(rid)
        tr(torch.arange(n, device="cuda")[None], np.array([0]), pool, lm.backend)
        ids.append(rid)
    pos = np.array([8, 13])
    for step in range(40):  # ten page boundaries for each row, the rows at different positions
        rows = [0] if 20 <= step < 25 else [0, 1]
        pool.activate_step(*[ids[r] for r in rows])
        tok = torch.tensor([[(step + r) % 200] for r in rows], device="cuda")
        eager = tr(tok, pos[rows], pool, lm.backend)
        graph = runner.forward(tok, pos[rows])  # rewrites the same KV with the same values
        assert_close(graph, eager)
        pos[rows] += 1
    assert runner.captures == 2 and sorted(runner.buckets) == [(1, 1), (2, 1)]
    assert runner.enabled
    pool.check_invariants()


def test_verify_graph_one_capture_over_40_rounds_and_an_unrelated_prefill(model_dir):
    lm = load(model_dir)
    runner, tr, pool = lm.runner.verify_graphs, lm.transformer, lm.pool
    rid = pool.bind_request(list(range(8)), 200)
    pool.activate_step(rid)
    tr(torch.arange(8, device="cuda")[None], np.array([0]), pool, lm.backend)
    start = 8
    for rnd in range(40):
        if rnd == 13:  # another request's prefill between rounds must not disturb the graph
            other = pool.bind_request(list(range(50, 87)), 64)
            pool.activate_step(other)
            tr(torch.arange(50, 87, device="cuda")[None], np.array([0]), pool, lm.backend)
            pool.unbind_request(other)
            pool.activate_step(rid)
        window = torch.tensor([[rnd % 250, 3, 4]], device="cuda")
        eager = tr(window, np.array([start]), pool, lm.backend)
        graph = runner.forward(window, np.array([start]))
        assert_close(graph, eager)
        pool.truncate_to(start + 3, start + 3)
        start += 3
    assert runner.captures == 1 and list(runner.buckets) == [(1, 3)]


def test_ragged_verify_graph_captures_once_per_batch_size(model_dir):
    lm = load(model_dir)
    runner, tr, pool = lm.runner.verify_graphs, lm.transformer, lm.pool
    lengths = [8, 21, 35]
    ids = []
    for n in lengths:
        rid = pool.bind_request(list(range(n)), 200)
        pool.activate_step(rid)
        tr(torch.arange(n, device="cuda")[None], np.array([0]), pool, lm.backend)
        ids.append(rid)
    pos = dict(zip(ids, lengths))
    for rnd in range(40):
        rows = [ids[0], ids[2]] if 14 <= rnd <= 24 else ids
        pool.activate_step(*rows)
        start = np.array([pos[r] for r in rows])
        window = torch.tensor([[rnd % 250, 5, 6]] * len(rows), device="cuda")
        eager = tr(window, start, pool, lm.backend)
        graph = runner.forward(window, start)
        assert_close(graph, eager)
        for r in rows:
            pos[r] += 3
    assert runner.captures == 2  # (3, 3) and (2, 3): the batch change moves no buffer


@pytest.mark.parametrize("spec", [0, 3])
def test_generate_with_graphs_equals_generate_without(model_dir, spec):
    prompt = list(range(30, 70))
    without = load(model_dir, False)
    assert without.runner.decode_graphs is None
    b = without.generate(prompt, 60, speculative_tokens=spec)
    with_graphs = load(model_dir, True)  # closes the first: each pool takes half of the GPU
    assert with_graphs.runner.decode_graphs is not None
    a = with_graphs.generate(prompt, 60, speculative_tokens=spec)
    assert a.tokens == b.tokens
    used = with_graphs.runner.verify_graphs if spec else with_graphs.runner.decode_graphs
    assert used.captures >= 1


def test_fp8_kv_scale_change_recaptures(model_dir):
    lm = load(model_dir)
    runner, tr = lm.runner.decode_graphs, lm.transformer
    pool = KvCachePool(2, 4 * 256, 2, 128, 4, "cuda", torch.float8_e4m3fn)
    pool.prefix_reuse_enabled = False
    runner = type(runner)(tr, pool)
    for scales, captures in (((1.0, 1.0), 1), ((0.5, 2.0), 2)):
        pool.unbind_requests()
        pool.set_kv_scales(*scales)
        rid = pool.bind_request(list(range(8)), 100)
        pool.activate_step(rid)
        tr(torch.arange(8, device="cuda")[None], np.array([0]), pool, lm.backend)
        for step in range(6):
            pos = np.array([8 + step])
            tok = torch.tensor([[step]], device="cuda")
            assert_close(runner.forward(tok, pos), tr(tok, pos, pool, lm.backend))
        assert runner.captures == captures
