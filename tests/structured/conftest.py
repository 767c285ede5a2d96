"""Models for the structured-output tests: the shipped byte-level model (with its MTP head, an n-gram drafter, and
the shipped draft model), and a tiny random Qwen3 with a byte-level BPE ``tokenizer.json`` trained here on JSON-like
text (a real multi-byte vocabulary, padded past the tokenizer's own size), built once per session with fixed seeds.
Also the schemas every test draws from: bounded (no extra properties, short strings, enums, bounded numbers), so a
valid output always finishes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from smile_llm import LanguageModel
from smile_llm.models.shipped import DEFAULT_DRAFT_DIR, DEFAULT_MODEL_DIRS

CI = os.environ.get("SMILE_TEST_SCALE", "full") == "ci"

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 6},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "email": {"type": "string", "maxLength": 5}},
        "required": ["name", "age"], "additionalProperties": False},
    "nested": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": -5, "maximum": 5},
                       "owner": {"type": "object",
                                 "properties": {"role": {"enum": ["admin", "user", "guest"]},
                                                "active": {"type": "boolean"}},
                                 "required": ["role", "active"], "additionalProperties": False}},
        "required": ["id", "owner"], "additionalProperties": False},
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
                                "maxItems": 3},
                       "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                  "maxItems": 2}},
        "required": ["tags", "scores"], "additionalProperties": False},
    "any_of": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 10, "maximum": 99},
                                           {"type": "string", "maxLength": 3},
                                           {"type": "null"}]},
                       "flag": {"enum": [True, False]}},
        "required": ["value", "flag"], "additionalProperties": False},
    "number": {
        "type": "object",
        "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 1},
                       "unit": {"const": "kg"}},
        "required": ["ratio", "unit"], "additionalProperties": False},
}

JSON_CORPUS = [json.dumps(v) for v in (
    {"name": "Ada", "age": 36, "email": "a@b.c"}, {"id": 3, "owner": {"role": "admin", "active": True}},
    {"tags": ["red", "green"], "scores": [1, 2]}, {"value": None, "flag": False}, {"ratio": 0.25, "unit": "kg"},
    {"answer": "yes", "items": [1, 2, 3], "nested": {"a": [True, False, None]}},
)] + ["the quick brown fox jumps over the lazy dog", "0123456789 abc-def ghi_jkl"]


@pytest.fixture(scope="session")
def byte_model() -> LanguageModel:
    """The shipped byte-level model with its MTP drafter."""
    return LanguageModel.default()


@pytest.fixture(scope="session")
def ngram_model() -> LanguageModel:
    return LanguageModel.from_pretrained(DEFAULT_MODEL_DIRS["dense"], drafter="ngram")


@pytest.fixture(scope="session")
def draft_model() -> LanguageModel:
    """The shipped model drafting with the shipped small draft model."""
    return LanguageModel.from_pretrained(DEFAULT_MODEL_DIRS["dense"], drafter=f"draft:{DEFAULT_DRAFT_DIR}")


def build_bpe_tokenizer(vocab: int) -> Any:
    """A byte-level BPE of ``vocab`` entries trained on ``JSON_CORPUS``; ``<|endoftext|>`` is id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(JSON_CORPUS * 4, trainer)
    return tok


@pytest.fixture(scope="session")
def bpe_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A random Qwen3 (hidden 64, 2 layers) whose logits span 8 ids past its BPE tokenizer's vocabulary; returns
    the folder and the HF model (float32, eval)."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("bpe_qwen3")
    tok = build_bpe_tokenizer(400)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size() + 8
    torch.manual_seed(7)
    cfg = transformers.Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=None,
                                   eos_token_id=0, pad_token_id=None)
    hf = transformers.Qwen3ForCausalLM(cfg).eval()
    hf.save_pretrained(folder, safe_serialization=True)
    return folder, hf


@pytest.fixture(scope="session")
def bpe_model(bpe_checkpoint: tuple[Path, Any]) -> LanguageModel:
    return LanguageModel.from_pretrained(bpe_checkpoint[0], drafter="ngram", max_seq_len=512)
