"""Parity with Hugging Face ``transformers`` on tiny random Llama / Llama-3 / tied Llama / Qwen2 / Qwen3 checkpoints:
whole-prompt logits, step-by-step decode, ragged batched decode, greedy ``generate`` (incl. EOS), chunked prefill,
``generate_batch`` and page sizes 1 and 16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.serving import model_runner as decoder
from smile_llm.text.tokenizer import HFTokenizer

from tests.hf_zoo import FAMILIES, GEN_LEN, LONG_PROMPT, PROMPT, assert_clean, expected_greedy, max_abs

pytest.importorskip("transformers")

TOL = 1e-4


def _forward(lm, tokens: list[list[int]], start: list[int]) -> torch.Tensor:
    out = lm.transformer(torch.tensor(tokens, dtype=torch.int64), np.array(start, dtype=np.int64), lm.pool,
                         lm.backend)
    assert out.logits.dtype == torch.float32
    assert out.hidden.shape == (len(tokens), len(tokens[0]), lm.config.hidden_size)
    return out.logits


@pytest.mark.parametrize("family", FAMILIES)
def test_config_read_from_saved_checkpoint(zoo, family):
    hf = zoo(family)
    lm = hf.load()
    c, h = lm.config, hf.model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers) == (97, 32, 2)
    assert c.num_attention_heads == h.num_attention_heads and c.num_key_value_heads == h.num_key_value_heads
    assert c.head_dim == getattr(h, "head_dim", 32 // h.num_attention_heads)
    assert c.attention_bias == (family == "qwen2")
    assert c.qk_norm == (family == "qwen3")
    assert c.tie_word_embeddings == (family == "llama_tied")
    assert (c.rope_scaling is not None) == (family == "llama3")
    assert c.eos_token_ids == (() if hf.eos is None else (hf.eos,))
    if family == "llama_tied":
        assert lm.transformer.lm_head.weight.data_ptr() == lm.transformer.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_logits_match_hf(zoo, family):
    hf = zoo(family)
    lm = hf.load()
    ref = hf.logits(LONG_PROMPT)
    lm.pool.bind_with_prefix(LONG_PROMPT, len(LONG_PROMPT))
    try:
        ours = _forward(lm, [LONG_PROMPT], [0])[0]
    finally:
        lm.pool.unbind_requests()
    assert ours.shape == ref.shape == (len(LONG_PROMPT), 97)
    assert max_abs(ours, ref) < TOL
    assert_clean(lm.pool)


@pytest.mark.parametrize("family", FAMILIES)
def test_step_by_step_decode_matches_hf(zoo, family):
    """Prefill 9 tokens, then one token per forward; each step's logits equal HF's full-sequence logits there."""
    hf = zoo(family)
    lm = hf.load()
    seq = LONG_PROMPT
    ref = hf.logits(seq)
    prefill = 9
    lm.pool.bind_with_prefix(seq[:prefill], len(seq))
    try:
        logits = _forward(lm, [seq[:prefill]], [0])[0]
        assert max_abs(logits, ref[:prefill]) < TOL
        for pos in range(prefill, len(seq)):
            step = _forward(lm, [[seq[pos]]], [pos])[0, -1]
            assert max_abs(step, ref[pos]) < TOL, f"position {pos}"
    finally:
        lm.pool.unbind_requests()
    assert_clean(lm.pool)


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_ragged_batched_decode_matches_hf(zoo, family):
    """Three rows at different positions decode in one forward; each row's logits equal HF's at its position."""
    hf = zoo(family)
    lm = hf.load()
    pool = lm.pool
    seqs = [LONG_PROMPT, PROMPT[:13], PROMPT[5:22]]
    refs = [hf.logits(s) for s in seqs]
    prefills = [len(s) - 4 for s in seqs]
    rids = [pool.bind_request(s[:p], len(s)) for s, p in zip(seqs, prefills)]
    try:
        for rid, s, p, ref in zip(rids, seqs, prefills, refs):
            pool.activate_step(rid)
            assert max_abs(_forward(lm, [s[:p]], [0])[0], ref[:p]) < TOL
        pool.activate_step(*rids)
        for k in range(4):
            pos = [p + k for p in prefills]
            step = _forward(lm, [[s[q]] for s, q in zip(seqs, pos)], pos)
            for row, (ref, q) in enumerate(zip(refs, pos)):
                assert max_abs(step[row, -1], ref[q]) < TOL, f"row {row} position {q}"
    finally:
        for rid in rids:
            pool.unbind_request(rid)
    assert_clean(pool)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generate_matches_hf(zoo, family):
    hf = zoo(family)
    lm = hf.load()
    want, reason = expected_greedy(hf, PROMPT, GEN_LEN)
    c = lm.generate(PROMPT, GEN_LEN)
    assert c.tokens == want
    assert c.finish_reason == reason
    assert c.prompt_tokens == PROMPT
    if hf.eos is not None:  # the fixture picked an EOS that greedy decoding reaches
        assert reason == "stop" and hf.eos not in c.tokens
    assert c.stats["generated_tokens"] == len(c.tokens)
    assert c.stats["prompt_tokens"] == len(PROMPT) and c.stats["cached_tokens"] == 0
    assert_clean(lm.pool)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_chunked_prefill_gives_same_tokens(zoo, family, monkeypatch):
    hf = zoo(family)
    lm = hf.load()
    want, reason = expected_greedy(hf, LONG_PROMPT, GEN_LEN)
    plain = lm.generate(LONG_PROMPT, GEN_LEN, logprobs=True)
    monkeypatch.setattr(decoder, "PREFILL_CHUNK", 7)
    lm2 = hf.load()
    chunked = lm2.generate(LONG_PROMPT, GEN_LEN, logprobs=True)
    assert chunked.tokens == plain.tokens == want
    assert chunked.finish_reason == plain.finish_reason == reason
    np.testing.assert_allclose(chunked.logprobs, plain.logprobs, atol=1e-5)
    # 27 prompt tokens in chunks of 7 are 4 forwards instead of 1
    assert chunked.stats["forwards"] == plain.stats["forwards"] + 3
    assert_clean(lm2.pool)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_batch_of_ragged_prompts_equals_per_prompt(zoo, family):
    hf = zoo(family)
    lm = hf.load()
    prompts = [PROMPT, LONG_PROMPT[:9], LONG_PROMPT[3:20]]
    batch = lm.generate_batch(prompts, 8)
    assert_clean(lm.pool)
    assert [c.prompt_tokens for c in batch] == prompts
    for p, c in zip(prompts, batch):
        want, reason = expected_greedy(hf, p, 8)
        assert (c.tokens, c.finish_reason) == (want, reason)
        single = lm.generate(p, 8)  # the same pool: the batch's finished rows are now in the prefix cache
        assert single.stats["cached_tokens"] > 0
        assert (single.tokens, single.finish_reason, single.text) == (c.tokens, c.finish_reason, c.text)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("family", ["llama", "llama3", "qwen2", "qwen3"])
def test_page_sizes(zoo, family, page_size):
    hf = zoo(family)
    lm = hf.load(page_size=page_size)
    assert lm.pool.page_size == page_size
    want, reason = expected_greedy(hf, PROMPT, GEN_LEN)
    c = lm.generate(PROMPT, GEN_LEN)
    assert (c.tokens, c.finish_reason) == (want, reason)
    again = lm.generate(PROMPT, GEN_LEN)  # prefix reuse at this page size
    assert again.stats["cached_tokens"] > 0
    assert again.tokens == c.tokens
    assert_clean(lm.pool)


def test_text_prompt_with_hf_tokenizer(text_model):
    hf, tok = text_model
    lm = hf.load()
    assert isinstance(lm.tokenizer, HFTokenizer) and lm.tokenizer.vocab_size == 97
    text = "the small fox keeps a prompt in the shared pool"
    ids = tok.encode(text, add_special_tokens=False).ids
    chunks: list[str] = []

    class Listener:
        def on_text(self, chunk: str) -> None:
            chunks.append(chunk)

    c = lm.generate(text, 12, listener=Listener())
    assert c.prompt_tokens == ids
    want, _ = expected_greedy(hf, ids, 12)
    assert c.tokens == want
    assert c.text == tok.decode(c.tokens, skip_special_tokens=True)
    assert "".join(chunks) == c.text and all(chunks)
    assert lm.encode(text) == ids
    assert_clean(lm.pool)
