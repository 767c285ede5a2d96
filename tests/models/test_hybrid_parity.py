"""Hybrid Qwen3.5 / Qwen3-Next models (Gated DeltaNet + gated attention, Qwen3-Next's MoE) against ``transformers``
on tiny random checkpoints: logits over a whole prompt and step by step, greedy ``generate`` single and batched
(padded prefill batches, chunked prefills, batched decode), through the engine with preemption and with fewer
DeltaNet state slots than requests; the state pool is audited after each."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.engine import InferenceEngine, SamplingParams
from smile_llm.language_model import LanguageModel

from tests.hf_zoo import expected_greedy
from tests.models.hybrid_models import HYBRID_FAMILIES, HYBRID_PROMPT, hybrid_zoo, make_multimodal  # noqa: F401 - fixture

TOL = 1e-4  # float32 logits against transformers
PROMPTS = [HYBRID_PROMPT, [5, 9, 200, 17], [(7 * i + 3) % 256 for i in range(37)], [42] * 9]
NEW = 10


def assert_clean(lm: LanguageModel) -> None:
    pool = lm.pool
    pool.check_invariants()
    assert pool.bound_request_count == 0
    (states,) = pool.state_pools
    assert states.free_slots == states.max_requests


@pytest.fixture(scope="module", params=HYBRID_FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def hf(hybrid_zoo, family):  # noqa: F811 - the fixture above
    return hybrid_zoo(family)


@pytest.fixture(scope="module")
def lm(hf):
    model = hf.load(page_size=4, max_seq_len=128, max_batch_size=4, drafter=None)  # plain decoding
    yield model
    model.close()


def test_loaded_as_hybrid_with_a_state_pool_and_state_snapshots(lm, family):
    config = lm.config
    assert config.is_hybrid and config.model_type == family
    kv_layers = sum(t == "full_attention" for t in config.layer_types)
    assert lm.pool.num_layers == kv_layers == 1  # DeltaNet layers keep no KV
    (states,) = lm.pool.state_pools
    assert states.buffers["conv"].shape[:2] == (4, 3) and states.buffers["recurrent"].dtype == torch.float32
    assert lm.pool.prefix_reuse_enabled and states.snapshot_capacity == 8  # hits restore state snapshots


def test_prompt_and_step_logits_match_transformers(lm, hf):
    pool = lm.pool
    rid = pool.bind_request(HYBRID_PROMPT, 64)
    try:
        pool.activate_step(rid)
        out = lm.transformer(torch.tensor([HYBRID_PROMPT]), np.array([0]), pool, lm.backend)
        assert (out.logits[0] - hf.logits(HYBRID_PROMPT)).abs().max().item() < TOL
        seq = list(HYBRID_PROMPT)
        for _ in range(5):
            seq.append(int(out.logits[0, -1].argmax()))
            out = lm.transformer(torch.tensor([[seq[-1]]]), np.array([len(seq) - 1]), pool, lm.backend)
            assert (out.logits[0, -1] - hf.logits(seq)[-1]).abs().max().item() < TOL, f"step at {len(seq)}"
    finally:
        pool.unbind_request(rid)
    assert_clean(lm)


def test_greedy_generate_single_and_batched_equals_transformers(lm, hf):
    want = [expected_greedy(hf, p, NEW) for p in PROMPTS]
    for p, (tokens, reason) in zip(PROMPTS, want):
        out = lm.generate(p, NEW)
        assert (out.tokens, out.finish_reason) == (tokens, reason)
    # one padded prefill batch (rows of 4..37 tokens) then batched decode: padding never reaches a row's state
    batch = lm.generate_batch(PROMPTS, NEW)
    assert [(c.tokens, c.finish_reason) for c in batch] == want
    assert_clean(lm)


def test_chunked_prefill_and_fewer_state_slots_than_requests(lm, hf):
    """An engine prefilling 8 tokens per step (prompts split across forwards, the state carried between them) with
    8 concurrent requests for the pool's 4 state slots: the others wait for a slot."""
    prompts = PROMPTS * 2
    want = [expected_greedy(hf, p, NEW)[0] for p in prompts]
    with InferenceEngine(lm, max_batch_size=8, prefill_tokens_per_step=8) as engine:
        handles = [engine.submit(p, SamplingParams(NEW)) for p in prompts]
        assert [h.result(120).tokens for h in handles] == want
    assert_clean(lm)


def test_a_small_pool_serves_every_request_with_its_unconstrained_output(lm, hf):
    """A KV pool too small for every request at once (rows admitted as pages allow and grown as they decode; the
    scheduler may preempt, though these random models' outputs do not force it: offload and restore of the
    DeltaNet state are checked directly below): every output equals the unconstrained run."""
    from smile_llm.cache import KvCachePool, StatePool
    from smile_llm.models.state_step import state_specs

    config = lm.config
    states = StatePool(state_specs(config, torch.float32), 4)
    pool = KvCachePool(1, 240, config.num_key_value_heads, config.head_dim, 4)
    pool.attach_state(states)
    pool.prefix_reuse_enabled = False
    small = LanguageModel(config, lm.transformer, lm.tokenizer, pool, lm.backend, 128, drafter=None)
    try:
        prompts = PROMPTS + [[(11 * i + 5) % 256 for i in range(30)], [(3 * i + 1) % 256 for i in range(16)]]
        want = [expected_greedy(hf, p, 80)[0] for p in prompts]  # past the admission headroom: rows grow
        handles = [small.submit(p, SamplingParams(80)) for p in prompts]  # all queued before the first step
        assert [h.result(120).tokens for h in handles] == want
        assert_clean(small)
    finally:
        small.close()


def test_offload_and_restore_bring_back_the_state_after_another_request_used_its_slot(hf):
    """One state slot: request A decodes, is offloaded (KV and DeltaNet state to the host), request B takes the slot
    and overwrites it, then A is restored and continues with logits equal to transformers' full recompute."""
    lm = hf.load(page_size=4, max_seq_len=128, max_batch_size=1)
    pool = lm.pool

    def forward(rid: int, tokens: list[int], start: int) -> torch.Tensor:
        pool.activate_step(rid)
        return lm.transformer(torch.tensor([tokens]), np.array([start]), pool, lm.backend).logits[0, -1]

    try:
        a = pool.bind_request(HYBRID_PROMPT, 64)
        seq = list(HYBRID_PROMPT)
        logits = forward(a, seq, 0)
        for _ in range(3):
            seq.append(int(logits.argmax()))
            logits = forward(a, seq[-1:], len(seq) - 1)
        handle = pool.offload_request(a)
        b = pool.bind_request(PROMPTS[2], 64)  # the only state slot, overwritten by B's prompt
        forward(b, PROMPTS[2], 0)
        pool.unbind_request(b)
        pool.restore_request(a, handle)
        for _ in range(3):
            seq.append(int(logits.argmax()))
            logits = forward(a, seq[-1:], len(seq) - 1)
            assert (logits - hf.logits(seq)[-1]).abs().max().item() < TOL, f"after restore, position {len(seq)}"
        pool.unbind_request(a)
        assert_clean(lm)
    finally:
        lm.close()


def test_a_multimodal_checkpoint_serves_its_text_model(tmp_path, hybrid_zoo):  # noqa: F811
    hf = hybrid_zoo("qwen3_5")
    folder = make_multimodal(hf.path, tmp_path / "mm")
    with pytest.warns(UserWarning, match="vision tower"):
        lm = LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=128)
    try:
        assert lm.generate(HYBRID_PROMPT, NEW).tokens == expected_greedy(hf, HYBRID_PROMPT, NEW)[0]
    finally:
        lm.close()




class OracleWithMistakes:
    """Drafts each prompt's known greedy answer, spoiling draft ``round % (n + 1)`` of the round (no spoil when that
    is ``n``): the target keeps 0, 1, ..., n drafts in turn, so every rewind depth of the DeltaNet state is used."""

    num_speculative_tokens = 3

    def __init__(self, answers: dict[tuple[int, ...], list[int]]) -> None:
        self.answers, self.rounds = answers, 0

    def bind(self, seq, final_len: int) -> bool:
        seq.history = self
        return True

    def release(self, seq) -> None:
        seq.history = None

    def ready(self, seq) -> bool:
        return seq.history is self

    def max_batch(self, n: int) -> int:
        return 1 << 30

    def propose(self, seqs, n: int):
        rows = []
        for seq in seqs:
            done = len(seq.tokens)
            row = (self.answers[tuple(seq.prompt)][done:] + [0] * n)[:n]
            spoil = self.rounds % (n + 1)
            if spoil < n:
                row[spoil] = (row[spoil] + 1) % 256
            self.rounds += 1
            rows.append(row)
        return torch.tensor(rows, dtype=torch.int64), None

    def extend(self, seq, hidden, start: int) -> None:
        pass

    def absorb(self, seqs) -> None:
        pass

    def commit(self, seq, hidden) -> None:
        pass

    def close(self) -> None:
        pass


def test_speculative_decoding_rewinds_the_state_to_the_last_kept_position(lm, hf):
    """Verify windows keep the DeltaNet state after every position and restore, per row, the one after the last
    accepted draft: with drafts accepted 0..3 at a time, greedy output equals plain greedy (single and batched)."""
    want = [expected_greedy(hf, p, 24) for p in PROMPTS]
    answers = {tuple(p): w[0] for p, w in zip(PROMPTS, want)}
    spec = LanguageModel(lm.config, lm.transformer, lm.tokenizer, lm.pool, lm.backend, lm.max_seq_len,
                         drafter=OracleWithMistakes(answers))
    records: list = []
    out = spec.generate(PROMPTS[0], 24, on_round=records.append)
    assert (out.tokens, out.finish_reason) == want[0]
    assert {r.num_accepted for r in records} >= {0, 1, 2, 3}
    batch = spec.generate_batch(PROMPTS, 24)
    assert [(c.tokens, c.finish_reason) for c in batch] == want
    assert_clean(spec)
    spec.serving_loop.shutdown()


def test_the_mtp_head_speculates_losslessly(hf):
    """The checkpoint's MTP head (random weights: drafts are rarely right) drafts and the output stays plain greedy."""
    spec = hf.load(page_size=4, max_seq_len=128, max_batch_size=4, drafter="mtp")
    try:
        assert spec.drafter is not None
        want = [expected_greedy(hf, p, NEW) for p in PROMPTS]
        out = spec.generate(PROMPTS[0], NEW)
        assert (out.tokens, out.finish_reason) == want[0] and out.stats["speculative_rounds"] > 0
        assert [(c.tokens, c.finish_reason) for c in spec.generate_batch(PROMPTS, NEW)] == want
        assert_clean(spec)
    finally:
        spec.close()


def test_a_checkpoint_that_disagrees_with_its_config_fails_at_load_naming_the_tensor(tmp_path, hf):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "bad"
    shutil.copytree(hf.path, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    name = "model.layers.0.linear_attn.A_log"
    tensors[name] = torch.zeros(tensors[name].shape[0] + 1)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"tensor '{name}' has shape \(5,\) in the checkpoint but the config "
                                         rf"gives \(4,\)"):
        LanguageModel.from_pretrained(folder)
