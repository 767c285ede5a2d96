"""The CUDA-graph runners' logic on the CPU, through the capture seam.

``FakeGraphCapture`` (tests/flashinfer_fake.py) records the forward a runner captures and replays it with the
scalars frozen at capture; the strict stand-in ``flashinfer`` computes attention with the reference over the fixed
buffers the real kernel would read, and refuses what FlashInfer refuses. Each test runs the same tiny bf16 model on
two pools, one decoded eagerly (the FlashInfer backend in eager mode, so both paths run the same kernel) and one
through a runner, and compares them token for token and logit for logit; bucket counts and captures are asserted
exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.attention.flashinfer import FlashInferBackend
from smile_llm.cache import KvCachePool
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer
from smile_llm.serving.cuda_graphs import WARMUP_STEPS, DecodeGraphRunner, VerifyGraphRunner

from ..flashinfer_fake import FakeFlashInfer, FakeGraphCapture, install

CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 97, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "tie_word_embeddings": True}
PROMPTS = [[5, 17, 3, 44, 9, 60, 2], [71, 8, 30, 30, 11]]  # ragged: the rows decode at different positions


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeFlashInfer]:
    return install(monkeypatch)


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_dict(CONFIG)).to(torch.bfloat16).eval()


class Twin:
    """One pool decoded eagerly and one through the runners, with the same rows bound and prefilled."""

    def __init__(self, model: Transformer, page_size: int, kv_dtype: torch.dtype = torch.bfloat16,
                 scales: tuple[float, float] = (1.0, 1.0), max_batch: int = 4, max_buckets: int = 16) -> None:
        self.model = model
        self.pools = [KvCachePool(2, 512, 2, 64, page_size, "cpu", kv_dtype, k_scale=scales[0], v_scale=scales[1])
                      for _ in range(2)]
        for p in self.pools:
            p.prefix_reuse_enabled = False
        self.eager = FlashInferBackend("cpu")
        self.capture = FakeGraphCapture()
        graph_pool = self.pools[1]
        self.decode = DecodeGraphRunner(model, graph_pool, max_batch, graph_capture=self.capture,
                                        max_buckets=max_buckets)
        self.verify = VerifyGraphRunner(model, graph_pool, max_batch, graph_capture=self.capture,
                                        max_buckets=max_buckets)
        self.ids: list[list[int]] = [[], []]

    def bind(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """Bind and prefill ``prompts`` on both pools; returns each row's next position and last logits argmax."""
        for ids, pool in zip(self.ids, self.pools):
            ids.clear()
            for prompt in prompts:
                rid = pool.bind_request(prompt, 128)
                pool.activate_step(rid)
                self.model(torch.tensor([prompt]), np.array([0]), pool, self.eager)
                ids.append(rid)
        return [np.array([len(p) for p in prompts], dtype=np.int64)]

    def activate(self, rows: list[int]) -> None:
        for ids, pool in zip(self.ids, self.pools):
            pool.activate_step(*[ids[r] for r in rows])

    def decode_step(self, tokens: torch.Tensor, positions: np.ndarray) -> torch.Tensor:
        eager = self.model(tokens, positions, self.pools[0], self.eager)
        graph = self.decode.forward(tokens, positions)
        # exact: a replay here reruns the captured forward (one graph per batch size, no padding): the eager
        # forward's ops on equal inputs
        assert torch.equal(graph.logits, eager.logits) and torch.equal(graph.hidden, eager.hidden)
        return eager.logits[:, -1].argmax(-1)

    def verify_round(self, window: torch.Tensor, start: np.ndarray, accepted: np.ndarray) -> None:
        eager = self.model(window, start, self.pools[0], self.eager)
        graph = self.verify.forward(window, start)
        assert torch.equal(graph.logits, eager.logits) and torch.equal(graph.hidden, eager.hidden)  # as above
        w = window.shape[1]
        for pool in self.pools:
            pool.truncate_to(start + accepted, start + w)

    def unbind(self) -> None:
        for pool in self.pools:
            pool.unbind_requests()


def _greedy_decode(twin: Twin, rows: list[int], positions: np.ndarray, tokens: torch.Tensor,
                   steps: int) -> tuple[np.ndarray, torch.Tensor]:
    twin.activate(rows)
    for _ in range(steps):
        nxt = twin.decode_step(tokens, positions)
        tokens, positions = nxt[:, None], positions + 1
    return positions, tokens


@pytest.mark.parametrize("page_size", [1, 4])
def test_one_decode_graph_per_batch_size_replays_eager_decoding(fake: type[FakeFlashInfer], model: Transformer,
                                                               page_size: int) -> None:
    twin = Twin(model, page_size)
    (pos,) = twin.bind(PROMPTS)
    tok = torch.tensor([[1], [2]])
    pool = twin.pools[1]
    csr = pool.decode_graph_metadata(2)
    addresses = (csr.indptr.data_ptr(), csr.indices.data_ptr(), csr.last_page_len.data_ptr())
    pos, tok = _greedy_decode(twin, [0, 1], pos, tok, 12)  # crosses page boundaries (every step at page 1)
    assert twin.decode.captures == 1 and list(twin.decode.buckets) == [(2, 1)]
    assert twin.capture.warmups == WARMUP_STEPS and twin.capture.graphs[0].replays == 12 - WARMUP_STEPS
    assert (csr.indptr.data_ptr(), csr.indices.data_ptr(), csr.last_page_len.data_ptr()) == addresses
    # another batch size gets its own graph; coming back replays the first one
    p1, t1 = _greedy_decode(twin, [1], pos[1:], tok[1:], 4)
    assert twin.decode.captures == 2 and sorted(twin.decode.buckets) == [(1, 1), (2, 1)]
    pos, tok = np.array([pos[0], p1[0]]), torch.cat([tok[:1], t1])
    _greedy_decode(twin, [0, 1], pos, tok, 3)
    assert twin.decode.captures == 2 and twin.capture.graphs[0].replays == 12 - WARMUP_STEPS + 3
    for p in twin.pools:
        p.check_invariants()


def test_verify_graph_serves_every_round_across_page_growth_and_batch_changes(fake: type[FakeFlashInfer],
                                                                              model: Transformer) -> None:
    twin = Twin(model, 4)
    (start,) = twin.bind(PROMPTS)
    rng = np.random.default_rng(0)
    for rnd in range(14):
        rows = [1] if 6 <= rnd < 9 else [0, 1]
        twin.activate(rows)
        s = start[rows]
        window = torch.tensor([[(rnd * 7 + r) % 97, 3, 4] for r in rows])
        accepted = 1 + rng.integers(0, 3, size=len(rows))  # the bonus token plus 0..2 drafts
        twin.verify_round(window, s, accepted)
        start[rows] = s + accepted
    assert twin.verify.captures == 2 and sorted(twin.verify.buckets) == [(1, 3), (2, 3)]
    assert int(start.min()) > 4 * 4  # the rows grew over several pages under one graph each


def test_a_moved_graph_csr_drops_the_stale_buckets(fake: type[FakeFlashInfer], model: Transformer) -> None:
    twin = Twin(model, 4, max_batch=2)
    (pos,) = twin.bind(PROMPTS)
    pool = twin.pools[1]
    pool.consume_verify_graph_meta_realloc()
    pos, tok = _greedy_decode(twin, [0, 1], pos, torch.tensor([[1], [2]]), WARMUP_STEPS + 2)
    twin.activate([0, 1])
    twin.verify_round(torch.tensor([[tok[0, 0].item(), 5, 6], [tok[1, 0].item(), 7, 8]]), pos, np.array([3, 3]))
    pos = pos + 3
    assert (twin.decode.captures, twin.verify.captures) == (1, 0)
    old = pool.decode_graph_metadata(2)
    pool.reserve_graph_rows(8)  # the graph CSR moves: every captured graph would read freed tensors
    assert pool.consume_verify_graph_meta_realloc() is True and pool.consume_verify_graph_meta_realloc() is False
    assert pool.decode_graph_metadata(2).indices.data_ptr() != old.indices.data_ptr()
    pos, tok = _greedy_decode(twin, [0, 1], pos, torch.tensor([[3], [4]]), WARMUP_STEPS + 2)
    assert twin.decode.captures == 2 and len(twin.decode.buckets) == 1
    assert twin.decode.buckets[(2, 1)].backend.is_bound_to(pool.decode_graph_metadata(2))


def test_a_kv_scale_change_recaptures(fake: type[FakeFlashInfer], model: Transformer) -> None:
    twin = Twin(model, 4, kv_dtype=torch.float8_e4m3fn)
    (pos,) = twin.bind(PROMPTS)
    _greedy_decode(twin, [0, 1], pos, torch.tensor([[1], [2]]), WARMUP_STEPS + 3)
    graph = twin.capture.graphs[0]
    assert twin.decode.captures == 1 and {s[1:3] for _, s in graph.tape} == {(None, None)}
    twin.unbind()
    for p in twin.pools:
        p.set_kv_scales(0.5, 2.0)
    (pos,) = twin.bind(PROMPTS)
    _greedy_decode(twin, [0, 1], pos, torch.tensor([[1], [2]]), WARMUP_STEPS + 3)  # equal to eager at the new scales
    assert twin.decode.captures == 2 and {s[1:3] for _, s in twin.capture.graphs[1].tape} == {(0.5, 2.0)}


def test_the_graph_csr_is_never_overwritten_by_a_foreign_plan(fake: type[FakeFlashInfer],
                                                              model: Transformer) -> None:
    twin = Twin(model, 4)
    (pos,) = twin.bind(PROMPTS)
    pos, _ = _greedy_decode(twin, [0, 1], pos, torch.tensor([[1], [2]]), WARMUP_STEPS + 1)
    pool = twin.pools[1]
    csr = pool.decode_graph_metadata(2)
    before = csr.indices.clone(), csr.indptr.clone(), csr.last_page_len.clone()
    backend = twin.decode.buckets[(2, 1)].backend
    with pytest.raises(ValueError, match="FlashInfer would copy another one over it"):
        backend.plan(pool.build_flashinfer_metadata(3), num_qo_heads=4, num_kv_heads=2, head_dim=64,
                     q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(before, (csr.indices, csr.indptr, csr.last_page_len)))


def test_buckets_are_bounded_least_recently_used_first(fake: type[FakeFlashInfer], model: Transformer) -> None:
    twin = Twin(model, 4, max_buckets=2)
    (pos,) = twin.bind(PROMPTS + [[9, 9, 9]])
    tok = torch.tensor([[1], [2], [3]])
    for rows in ([0], [0, 1], [0, 1, 2], [0, 1]):
        twin.activate(rows)
        nxt = twin.decode_step(tok[rows], pos[rows])
        pos[rows] += 1
        tok[rows] = nxt[:, None]
    assert list(twin.decode.buckets) == [(3, 1), (2, 1)]  # batch 1 was dropped first


def test_eligibility_and_a_failed_capture(fake: type[FakeFlashInfer], model: Transformer) -> None:
    twin = Twin(model, 4, max_batch=2)
    assert twin.decode.eligible(np.array([3, 9])) and not twin.decode.eligible(np.array([1, 2, 3]))
    assert twin.verify.eligible(2) and not twin.verify.eligible(0) and not twin.verify.eligible(3)
    assert not DecodeGraphRunner(model, twin.pools[0]).enabled  # no CUDA: off unless given a capture

    class Broken(FakeGraphCapture):
        def capture(self, fn):  # type: ignore[no-untyped-def]
            raise RuntimeError("capture failed")

    twin.decode = DecodeGraphRunner(model, twin.pools[1], 2, graph_capture=Broken())
    (pos,) = twin.bind(PROMPTS)
    pos, tok = _greedy_decode(twin, [0, 1], pos, torch.tensor([[1], [2]]), WARMUP_STEPS)
    with pytest.raises(RuntimeError, match="capture failed"):
        twin.decode.forward(tok, pos)
    assert not twin.decode.enabled and not twin.decode.buckets
