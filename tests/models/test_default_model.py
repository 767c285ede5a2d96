"""The model shipped in the package: it loads offline, generates Python-like text, and reuses prefixes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from smile_llm import LanguageModel
from smile_llm.models.shipped import DEFAULT_MODEL_DIR


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel.default(max_seq_len=512)


def test_default_model_is_a_byte_level_qwen3_with_an_mtp_head(lm: LanguageModel) -> None:
    c = lm.config
    assert (c.model_type, c.vocab_size, c.mtp_num_hidden_layers, c.tie_word_embeddings) == ("qwen3", 257, 1, True)
    assert c.num_hidden_layers >= 8 and c.qk_norm and c.eos_token_ids == (256,)
    assert lm.transformer.mtp is not None and len(lm.transformer.mtp.layers) == 1
    assert lm.tokenizer.encode("é") == [0xC3, 0xA9] and lm.tokenizer.decode([0xC3, 0xA9, 256]) == "é"
    for name in ("config.json", "model.safetensors", "README.md", "loss_curve.png", "smile_tokenizer.json"):
        assert (DEFAULT_MODEL_DIR / name).is_file(), name


def test_greedy_generation_is_python_like_and_reuses_the_prefix(lm: LanguageModel) -> None:
    prompt = "import os\nimport sys\n\n\ndef main("
    first = lm.generate(prompt, 60)
    assert first.finish_reason in ("length", "stop") and len(first.tokens) > 0
    text = first.text
    assert any(word in text for word in ("self", "return", "if ", "args", "):", "=")), text
    again = lm.generate(prompt, 60)
    # 32 prompt bytes: the match stops below the last prompt token, at floor_page(31) = 16
    assert again.tokens == first.tokens and again.stats["cached_tokens"] == 16
    lm.pool.check_invariants()


def test_cli_generate_streams_text_and_stats() -> None:
    out = subprocess.run([sys.executable, "-m", "smile_llm", "generate", "--prompt", "def ", "--max-new-tokens", "20"],
                         capture_output=True, text=True, check=True).stdout
    text, _, stats = out.partition("\n[4 prompt tokens")  # the streamed completion, then the stats lines
    stats = "[4 prompt tokens" + stats
    found = re.match(r"\[4 prompt tokens, 0 cached, (\d+) generated, [\d.]+ tokens/s, \d+ threads?, "
                     r"finish: (length|stop)]\n"
                     r"\[speculative: (\d+) rounds, (\d+)/(\d+) drafts accepted, [\d.]+ tokens per round, "
                     r"[\d.]+ target forwards per token]\n$", stats)
    assert found, stats
    generated, rounds, accepted, proposed = (int(found.group(i)) for i in (1, 3, 4, 5))
    assert 0 < generated <= 20 and (generated == 20) == (found.group(2) == "length") and text.strip()
    assert rounds > 0 and 0 <= accepted <= proposed <= 3 * rounds  # the default model drafts 3 per round


def test_default_model_matches_transformers(lm: LanguageModel) -> None:
    transformers = pytest.importorskip("transformers")
    import numpy as np
    import torch

    hf = transformers.Qwen3ForCausalLM.from_pretrained(str(DEFAULT_MODEL_DIR), torch_dtype=torch.float32).eval()
    ids = lm.tokenizer.encode("class Parser:\n    def parse(self, text):\n")
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
    lm.pool.bind_with_prefix(ids, len(ids) + 1)
    try:
        got = lm.transformer(torch.tensor([ids]), np.array([0]), lm.pool, lm.backend).logits[0]
    finally:
        lm.pool.unbind_requests()
    assert (got - want).abs().max().item() < 1e-4


def test_prompt_longer_than_max_seq_len_is_refused_and_new_tokens_are_clamped(lm: LanguageModel) -> None:
    with pytest.raises(ValueError, match="exceeds max_seq_len 512"):
        lm.generate([65] * 513, 4)
    out = lm.generate([65] * 500, 100)
    assert len(out.tokens) <= 12 and out.finish_reason in ("length", "stop")
    assert lm.pool.bound_request_count == 0
    lm.pool.check_invariants()


def test_batch_rows_with_a_negative_seed_stay_reproducible(lm: LanguageModel) -> None:
    a = lm.generate_batch(["def ", "class "], 24, temperature=0.9, seed=-1)
    b = lm.generate_batch(["def ", "class "], 24, temperature=0.9, seed=-1)
    assert [c.tokens for c in a] == [c.tokens for c in b]


def test_cli_keeps_non_ascii_prompts_and_reports_bad_input() -> None:
    out = subprocess.run([sys.executable, "-m", "smile_llm", "generate", "--prompt", "# héllo 日本\\ndef ",
                          "--max-new-tokens", "4"], capture_output=True, text=True, check=True).stdout
    assert "[20 prompt tokens" in out  # 20 UTF-8 bytes: the \n escape became one newline
    bad = subprocess.run([sys.executable, "-m", "smile_llm", "generate", "--prompt", ""], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "prompt is empty" in bad.stderr


@pytest.mark.parametrize("bad", [-1, 257, 10**9, 2**40])
def test_decode_refuses_every_id_outside_the_vocabulary_alike(lm: LanguageModel, bad: int) -> None:
    assert lm.decode([104, 105, 256]) == "hi"
    with pytest.raises(ValueError, match=rf"^token {bad} is outside the vocabulary \[0, 257\)$"):
        lm.decode([104, bad])
