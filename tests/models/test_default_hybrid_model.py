"""The hybrid model shipped in the package (``LanguageModel.default(kind="hybrid")``): a trained Qwen3.5 text model
with an MTP head. It loads offline, equals ``transformers`` on its own weights, speculates losslessly with real
acceptance, and reuses prefixes through its state snapshots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm import LanguageModel
from smile_llm.models.shipped import DEFAULT_MODEL_DIRS

CODE = "import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n"


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel.default(kind="hybrid", max_seq_len=512)


def test_the_hybrid_default_model_is_a_byte_level_qwen3_5_with_an_mtp_head(lm: LanguageModel) -> None:
    c = lm.config
    assert (c.model_type, c.vocab_size, c.mtp_num_hidden_layers, c.tie_word_embeddings) == ("qwen3_5", 257, 1, True)
    assert c.is_hybrid and c.layer_types.count("linear_attention") == 3 * c.layer_types.count("full_attention")
    assert lm.pool.num_layers == c.layer_types.count("full_attention")  # only full attention keeps KV
    (states,) = lm.pool.state_pools
    assert states.buffers["recurrent"].shape[1] == c.layer_types.count("linear_attention")
    assert lm.transformer.mtp is not None and lm.pool.prefix_reuse_enabled
    for name in ("config.json", "model.safetensors", "README.md", "loss_curve.png", "smile_tokenizer.json"):
        assert (DEFAULT_MODEL_DIRS["hybrid"] / name).is_file(), name
    with pytest.raises(ValueError, match="kind"):
        LanguageModel.default(kind="hybird")


def test_it_matches_transformers_on_its_own_weights(lm: LanguageModel) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(str(DEFAULT_MODEL_DIRS["hybrid"]),
                                                         torch_dtype=torch.float32).eval()
    ids = lm.encode(CODE)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([ids])).logits[0, -1]
        tokens = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=24, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    if 256 in tokens:
        tokens = tokens[: tokens.index(256)]
    rid = lm.pool.bind_request(ids, len(ids) + 1)
    lm.pool.activate_step(rid)
    got = lm.transformer(torch.tensor([ids]), np.array([0]), lm.pool, lm.backend).logits[0, -1]
    lm.pool.unbind_request(rid)
    assert (got - want).abs().max().item() < 1e-4
    assert lm.generate(ids, 24, speculative_tokens=0).tokens == tokens


def test_mtp_speculation_is_lossless_with_real_acceptance(lm: LanguageModel) -> None:
    plain = lm.generate(CODE, 80, speculative_tokens=0)
    spec = lm.generate(CODE, 80, speculative_tokens=3)
    assert spec.tokens == plain.tokens
    assert spec.stats["mean_accepted_length"] > 1.5  # a trained head: more than one token per verify forward
    lm.pool.check_invariants()


def test_a_second_turn_reuses_the_first_through_a_state_snapshot(lm: LanguageModel) -> None:
    first = lm.generate(CODE, 40)
    follow = lm.encode(CODE) + first.tokens + lm.encode("\n# user: go on\n")
    again = lm.generate(follow, 20)
    written = len(lm.encode(CODE)) + len(first.tokens) - (1 if first.finish_reason == "length" else 0)
    assert again.stats["cached_tokens"] == written // lm.pool.page_size * lm.pool.page_size > 0
    cold = LanguageModel.default(kind="hybrid", max_seq_len=512, state_snapshots=0)
    try:
        assert cold.generate(follow, 20).tokens == again.tokens
    finally:
        cold.close()
    lm.pool.check_invariants()
