"""Hostile model folders: every file of a checkpoint is input, and a bad one fails fast with a typed error that names
the file and the field, tensor or template, before anything is allocated.

``config.json`` fields of the wrong type, out of range or inconsistent (with each other and with the safetensors
headers); corrupt safetensors headers (length, JSON, dtype, shape and offset lies, truncation, overlap); shard
indexes that point outside the folder; unreadable tokenizer files; chat templates that fail, recurse, include, run
for minutes or build gigabytes; and ``chat_template_kwargs`` of the wrong type. Tiny checkpoints are written into
``tmp_path``; nothing here needs ``transformers``.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import smile_llm.language_model as language_model
from smile_llm.language_model import LanguageModel
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer
from smile_llm.text.chat_template import ChatTemplate, check_template_kwargs
from smile_llm.text.limits import RenderLimits
from smile_llm.models.checkpoint.checks import check_checkpoint, expected_dense_tensors
from smile_llm.errors import (ChatTemplateError, CheckpointError, ConfigError, ModelFileError,
                                    RenderBudgetError, TokenizerError)
from smile_llm.models.checkpoint.hybrid_layout import expected_hybrid_tensors
from smile_llm import RequestTypeError
from smile_llm.text.tokenizer import load_tokenizer
from smile_llm.models.checkpoint.weights import checkpoint_shapes, read_checkpoint

CONFIG: dict[str, Any] = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                          "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                          "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                          "tie_word_embeddings": False, "eos_token_id": 63}
HYBRID: dict[str, Any] = {
    "model_type": "qwen3_next", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "layer_types": ["linear_attention",
                                                                                        "full_attention"],
    "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
    "shared_expert_intermediate_size": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 0.25}}


def config(**overrides: Any) -> dict[str, Any]:
    return {k: v for k, v in {**CONFIG, **overrides}.items() if v is not None}


def write_checkpoint(folder: Path, cfg: dict[str, Any] | None = None, *, file_config: dict[str, Any] | None = None
                     ) -> Path:
    """A tiny random checkpoint of ``cfg`` in ``folder`` (``config.json`` holds ``file_config`` when given)."""
    from safetensors.torch import save_file

    cfg = cfg or config()
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_dict(cfg))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        del state["lm_head.weight"]  # the embedding's own storage
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(file_config if file_config is not None else cfg))
    return folder


def load(folder: Path) -> LanguageModel:
    return LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=32, drafter=None)


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if ``from_pretrained`` gets as far as building the model (allocating its parameters)."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was built before the bad input was refused")

    monkeypatch.setattr(language_model, "Transformer", refuse)


# ---------------------------------------------------------------------------------------------- config.json fields
@pytest.mark.parametrize("overrides, field, words", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers", "exceeds the limit 1024"),
    ({"num_hidden_layers": 0}, "num_hidden_layers", "must be positive"),
    ({"num_hidden_layers": 2.0}, "num_hidden_layers", "must be an integer"),
    ({"num_hidden_layers": True}, "num_hidden_layers", "must be an integer"),
    ({"num_attention_heads": 0}, "num_attention_heads", "must be positive"),
    ({"hidden_size": -16}, "hidden_size", "must be positive"),
    ({"intermediate_size": -1}, "intermediate_size", "must be positive"),
    ({"vocab_size": -64}, "vocab_size", "must be positive"),
    ({"vocab_size": "64"}, "vocab_size", "must be an integer"),
    ({"num_key_value_heads": 0}, "num_key_value_heads", "must be positive"),
    ({"num_key_value_heads": 4}, "num_key_value_heads", "not a multiple of num_key_value_heads 4"),
    ({"head_dim": 0}, "head_dim", "must be positive"),
    ({"head_dim": 7}, "head_dim", "must be even"),
    ({"head_dim": None, "hidden_size": 15, "num_attention_heads": 2}, "num_attention_heads", "not a multiple"),
    ({"rope_theta": "x"}, "rope_theta", "must be a number"),
    ({"rope_theta": 0}, "rope_theta", "greater than 0"),
    ({"rope_theta": math.inf}, "rope_theta", "finite"),
    ({"rms_norm_eps": math.nan}, "rms_norm_eps", "finite"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps", "greater than 0"),
    ({"rope_scaling": {"rope_type": "llama3", "original_max_position_embeddings": 64}}, "rope_scaling.factor",
     "lacks"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.original_max_position_embeddings",
     "lacks"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 64}}, "rope_scaling.high_freq_factor", "greater than"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": -1, "original_max_position_embeddings": 64}},
     "rope_scaling.factor", "greater than 0"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type", "not supported"),
    ({"rope_scaling": {"rope_type": 3}}, "rope_scaling.rope_type", "must be a string"),
    ({"rope_scaling": "llama3"}, "rope_scaling", "must be an object"),
    ({"rope_theta": None, "rope_parameters": {"rope_theta": "big"}}, "rope_parameters.rope_theta",
     "must be a number"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings", "must be true or false"),
    ({"tie_word_embeddings": 0}, "tie_word_embeddings", "must be true or false"),
    ({"attention_bias": "true"}, "attention_bias", "must be true or false"),
    ({"max_position_embeddings": 0}, "max_position_embeddings", "must be positive"),
    ({"max_position_embeddings": 1 << 40}, "max_position_embeddings", "exceeds the limit"),
    ({"eos_token_id": 64}, "eos_token_id", "exceeds the limit 63"),
    ({"eos_token_id": [1, -1]}, "eos_token_id[1]", "must be at least 0"),
    ({"eos_token_id": "2"}, "eos_token_id", "must be an integer"),
    ({"bos_token_id": 10**9}, "bos_token_id", "exceeds the limit 63"),
    ({"model_type": 5}, "model_type", "must be a string"),
    ({"hidden_act": "gelu"}, "hidden_act", "not supported"),
    ({"mtp_num_hidden_layers": -1}, "mtp_num_hidden_layers", "at least 0"),
    ({"mtp_num_hidden_layers": 1, "speculative_config": 3}, "speculative_config", "must be an object"),
    ({"mtp_num_hidden_layers": 1, "speculative_config": {"num_speculative_tokens": "3"}},
     "speculative_config.num_speculative_tokens", "must be an integer"),
])
def test_bad_config_fields_are_refused_by_name(overrides: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict(config(**overrides))
    assert info.value.field == field and field in str(info.value) and words in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("overrides, field, words", [
    ({"layer_types": ["linear_attention"]}, "layer_types", "1 entries but num_hidden_layers is 2"),
    ({"layer_types": ["linear_attention", 7]}, "layer_types", "layer_types[1] must be a string"),
    ({"layer_types": "full_attention"}, "layer_types", "must be a list"),
    ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim", "at least 2"),
    ({"linear_num_key_heads": -2}, "linear_num_key_heads", "must be positive"),
    ({"mamba_ssm_dtype": "cuda"}, "mamba_ssm_dtype", "not supported"),
    ({"num_experts": 10**6}, "num_experts", "exceeds the limit"),
    ({"num_experts": -1}, "num_experts", "at least 0"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok", "must be positive"),
    ({"mlp_only_layers": ["a"]}, "mlp_only_layers[0]", "must be an integer"),
    ({"norm_topk_prob": "true"}, "norm_topk_prob", "must be true or false"),
    ({"attn_output_gate": "false"}, "attn_output_gate", "must be true or false"),
    ({"partial_rotary_factor": 0}, "partial_rotary_factor", "greater than 0"),
    ({"partial_rotary_factor": 2.0}, "partial_rotary_factor", "at most 1"),
    ({"rope_parameters": {"rope_theta": 1e4, "mrope_section": "2,1,1"}}, "rope_parameters.mrope_section",
     "must be a list"),
    ({"rope_parameters": {"rope_theta": 1e4, "mrope_interleaved": "yes"}}, "rope_parameters.mrope_interleaved",
     "must be true or false"),
])
def test_bad_hybrid_fields_are_refused_by_name(overrides: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict({**HYBRID, **overrides})
    assert info.value.field == field and words in str(info.value)


def test_the_multimodal_text_config_is_named_by_its_path() -> None:
    text = {**HYBRID, "model_type": "qwen3_5_text", "hidden_size": "wide"}
    with pytest.raises(ConfigError, match=r"text_config\.hidden_size must be an integer"):
        ModelConfig.from_dict({"model_type": "qwen3_5", "text_config": text})


def test_null_fields_take_their_defaults() -> None:
    c = ModelConfig.from_dict(config(head_dim=None, rope_scaling=None) | {"num_key_value_heads": None,
                                                                           "bos_token_id": None,
                                                                           "eos_token_id": None,
                                                                           "tie_word_embeddings": None})
    assert (c.num_key_value_heads, c.head_dim, c.bos_token_id, c.eos_token_ids, c.tie_word_embeddings) == \
        (2, 8, None, (), False)


def test_a_huge_layer_count_fails_at_once_naming_the_field_and_the_file(tmp_path: Path, no_model: None) -> None:
    folder = write_checkpoint(tmp_path / "m", file_config=config(num_hidden_layers=10**6))
    start = time.monotonic()
    with pytest.raises(ConfigError, match="num_hidden_layers 1000000 exceeds the limit") as info:
        load(folder)
    assert time.monotonic() - start < 5
    assert info.value.path == folder / "config.json" and str(folder / "config.json") in str(info.value)


def test_a_string_false_is_not_read_as_true(tmp_path: Path, no_model: None) -> None:
    folder = write_checkpoint(tmp_path / "m", file_config=config(tie_word_embeddings="false"))
    with pytest.raises(ConfigError, match="tie_word_embeddings must be true or false, got 'false'"):
        load(folder)


@pytest.mark.parametrize("text, words", [("{not json", "not valid JSON"), ("[1, 2]", "must hold a JSON object"),
                                         ("\xff\xfe", "not valid JSON")])
def test_a_config_json_that_is_not_an_object_names_the_file(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError, match=words) as info:
        ModelConfig.from_pretrained(tmp_path)
    assert info.value.path == tmp_path / "config.json"


DEEP = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError
NESTED = "[" * 950 + "]" * 950  # parses, but its repr in an error message recursed as deep again
HUGE = "1" * 5000  # json.loads: ValueError, not JSONDecodeError (Python reads at most 4300 digits)


def config_text(field: str, raw: str) -> str:
    """``config.json``'s text with ``field`` set to the raw JSON ``raw``."""
    return json.dumps(config(**{field: 0}))[:-1].replace(f'"{field}": 0', f'"{field}": {raw}') + "}"


@pytest.mark.parametrize("name, text, error, words", [
    ("config.json", config_text("extra", DEEP), ConfigError, "config.json: is not valid JSON: it nests"),
    ("config.json", config_text("extra", HUGE), ConfigError, "holds an integer of more digits than Python reads"),
    ("config.json", config_text("num_hidden_layers", HUGE), ConfigError, "integer of more digits"),
    ("config.json", config_text("num_hidden_layers", NESTED), ConfigError,
     "num_hidden_layers must be an integer, got [[[[...]]]] (list)"),
    ("config.json", config_text("rope_scaling", '{"rope_type": ' + NESTED + "}"), ConfigError,
     "rope_scaling.rope_type must be a string, got [[[[...]]]]"),
    ("config.json", config_text("model_type", json.dumps("q" * 1_000_000)), ConfigError, "'qqqqq"),
    ("tokenizer_config.json", '{"x": ' + DEEP + "}", ChatTemplateError, "tokenizer_config.json is not valid JSON"),
    ("tokenizer_config.json", '{"x": ' + HUGE + "}", ChatTemplateError, "integer of more digits"),
    ("tokenizer_config.json", '{"eos_token": ' + NESTED + "}", ChatTemplateError,
     "eos_token must be a string or an AddedToken object"),
    ("tokenizer_config.json", '{"bos_token": {"content": 5}}', ChatTemplateError, "bos_token must be a string"),
    ("model.safetensors.index.json", '{"weight_map": ' + DEEP + "}", CheckpointError, "it nests"),
    ("model.safetensors.index.json", '{"weight_map": {"a": "model.safetensors"}, "n": ' + HUGE + "}", CheckpointError,
     "integer of more digits"),
    ("tokenizer.json", '{"x": ' + DEEP + "}", TokenizerError, "tokenizer.json"),
    ("tokenizer.json", '{"version": "1.0", "x": ' + HUGE + "}", TokenizerError, "tokenizer.json"),
    ("chat_template.jinja", "{{ " + "(" * 100_000 + "1" + ")" * 100_000 + " }}", ChatTemplateError, "does not compile"),
    ("chat_template.jinja", "{{ " + "[" * 5000 + "]" * 5000 + " }}", ChatTemplateError, "does not compile"),
    ("chat_template.jinja", "{{ " + HUGE + " }}", ChatTemplateError, "does not compile"),
    ("chat_template.jinja", "{{ x }}" * 100_000, ChatTemplateError, "at most 262144 are compiled"),
])
def test_deep_nesting_and_huge_integers_in_any_file_are_typed_errors(
        tmp_path: Path, name: str, text: str, error: type[Exception], words: str) -> None:
    """Every JSON or text file of the folder that loading reads: nesting too deep for ``json.loads`` (or for the repr
    of an error message), integers longer than Python reads and oversized templates fail to load with the file's
    typed error (a ValueError), not a RecursionError or a plain ValueError."""
    pytest.importorskip("jinja2")
    pytest.importorskip("tokenizers")
    folder = write_checkpoint(tmp_path / "m", config(vocab_size=257, eos_token_id=256))
    (folder / name).write_text(text)
    start = time.monotonic()
    with pytest.raises(error) as info:
        load(folder)
    assert words in str(info.value) and name in str(info.value) and isinstance(info.value, ValueError)
    assert len(str(info.value)) < 1000 and time.monotonic() - start < 30


def test_named_templates_with_odd_names_are_skipped(tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": [1], "template": "list"}, {"name": "default", "template": "first"}, "junk",
        {"name": "default", "template": "{{ messages[0].content }}"}]}))
    template = ChatTemplate.from_folder(tmp_path)
    assert template is not None and template.render(MESSAGES) == "hi"


def test_the_cli_refuses_a_deeply_nested_config_in_one_line(tmp_path: Path) -> None:
    """``smile-llm generate --model DIR`` (and ``serve``, which checks the folder the same way): exit code 2 and one
    line on stderr, no traceback."""
    import subprocess
    import sys

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": ' + DEEP + "}")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK")}
    out = subprocess.run([sys.executable, "-m", "smile_llm", "generate", "--model", str(folder), "--prompt", "hi"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "config.json is not valid JSON (it nests arrays or objects too deeply)" in out.stderr
    (folder / "config.json").write_text('{"a": ' + HUGE + "}")
    assert "config.json is not valid JSON (it holds an integer" in \
        subprocess.run([sys.executable, "-m", "smile_llm", "generate", "--model", str(folder), "--prompt", "hi"],
                       capture_output=True, text=True, timeout=300, env=env).stderr


# ---------------------------------------------------------------------------------------------- config vs headers
@pytest.mark.parametrize("overrides, field, words", [
    ({"num_hidden_layers": 3}, "num_hidden_layers", "num_hidden_layers 3 but the checkpoint holds decoder layers 0-1"),
    ({"num_hidden_layers": 1000}, "num_hidden_layers", "num_hidden_layers 1000"),
    ({"vocab_size": 65}, "vocab_size", "vocab_size 65 but tensor 'model.embed_tokens.weight' has shape (64, 16)"),
    ({"hidden_size": 24}, "hidden_size", "hidden_size 24"),
    ({"mtp_num_hidden_layers": 1}, "mtp_num_hidden_layers", "mtp_num_hidden_layers 1 but the checkpoint holds no MTP"),
    ({"intermediate_size": 48}, "model.layers.0.mlp.gate_proj.weight", "[intermediate_size, hidden_size]"),
    ({"num_key_value_heads": 2}, "model.layers.0.self_attn.k_proj.weight", "(8, 16) in the checkpoint but config"),
])
def test_a_config_that_disagrees_with_the_headers_fails_before_allocating(
        tmp_path: Path, no_model: None, overrides: dict[str, Any], field: str, words: str) -> None:
    folder = write_checkpoint(tmp_path / "m", file_config=config(**overrides))
    with pytest.raises(CheckpointError) as info:
        load(folder)
    assert info.value.field == field and words in str(info.value)
    assert str(folder) in str(info.value)


def test_a_tied_checkpoint_with_or_without_lm_head_loads(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = write_checkpoint(tmp_path / "m", config(tie_word_embeddings=True))
    lm = load(folder)
    lm.close()
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"][:, :8].contiguous()
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"'lm_head.weight' has shape \(64, 8\)"):
        load(folder)


def test_a_missing_layer_is_named(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = write_checkpoint(tmp_path / "m")
    tensors = {n: t for n, t in load_file(str(folder / "model.safetensors")).items()
               if not n.startswith("model.layers.1.")}
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="holds decoder layers 0-0 \\(1\\)"):
        load(folder)


def _write_hybrid(folder: Path, cfg: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    shapes = expected_hybrid_tensors(ModelConfig.from_dict(cfg))
    save_file({n: torch.zeros(s) for n, s in shapes.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_hybrid_expert_and_layer_counts_are_checked_against_the_headers(tmp_path: Path) -> None:
    folder = _write_hybrid(tmp_path / "h", HYBRID)
    assert check_checkpoint(ModelConfig.from_pretrained(folder), folder)["lm_head.weight"] == (64, 16)
    with pytest.raises(CheckpointError, match="num_experts 8 but the checkpoint holds experts 0-3 \\(4\\)") as info:
        check_checkpoint(ModelConfig.from_dict({**HYBRID, "num_experts": 8}), folder)
    assert info.value.field == "num_experts"
    with pytest.raises(CheckpointError, match="num_hidden_layers 4") as info:
        check_checkpoint(ModelConfig.from_dict({**HYBRID, "num_hidden_layers": 4, "layer_types": None}), folder)
    with pytest.raises(CheckpointError, match=r"layer_types\[0\] is 'full_attention'"):  # the hybrid layout check
        check_checkpoint(ModelConfig.from_dict({**HYBRID, "layer_types": ["full_attention"] * 2}), folder)


@pytest.mark.parametrize("cfg", [
    config(), config(model_type="llama", head_dim=None), config(model_type="qwen2"), config(tie_word_embeddings=True),
    config(mtp_num_hidden_layers=2), config(model_type="llama", attention_bias=True, num_key_value_heads=2)])
def test_the_dense_layout_is_the_modules_own(cfg: dict[str, Any]) -> None:
    c = ModelConfig.from_dict(cfg)
    params = {n: tuple(p.shape) for n, p in Transformer(c).named_parameters()}
    if c.tie_word_embeddings:  # shared with the embedding: named_parameters lists it once
        params.pop("lm_head.weight", None)
    assert expected_dense_tensors(c) == params


# ---------------------------------------------------------------------------------------------- safetensors headers
def raw_file(path: Path, header: Any, data: bytes, length: int | None = None) -> Path:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


F32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, data, length, words", [
    ({"a": F32}, b"\0" * 8, 2**60, "declares a 1152921504606846976-byte header"),
    ({"a": F32}, b"\0" * 8, 10_000, "truncated or not a safetensors file"),
    (b"{not json", b"", None, "not valid JSON"),
    (b"\xff\xfe{}", b"", None, "not valid JSON"),
    ([1, 2], b"", None, "not an object"),
    (b'{"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, "a": {"dtype": "F32", "shape": [0], '
     b'"data_offsets": [0, 0]}}', b"", None, "appears twice"),
    ({"a": {**F32, "dtype": "Q8"}}, b"\0" * 8, None, "tensor 'a' has dtype 'Q8'"),
    ({"a": {**F32, "shape": [3]}}, b"\0" * 8, None, "tensor 'a' has shape (3,) of F32 (12 bytes)"),
    ({"a": {**F32, "shape": [-2]}}, b"\0" * 8, None, "tensor 'a' has shape [-2]"),
    ({"a": {**F32, "shape": [True, 2]}}, b"\0" * 8, None, "tensor 'a' has shape [true, 2]".replace("true", "True")),
    ({"a": {**F32, "data_offsets": [8, 0]}}, b"\0" * 8, None, "tensor 'a' has data_offsets [8, 0]"),
    ({"a": {**F32, "data_offsets": [0]}}, b"\0" * 8, None, "tensor 'a' has data_offsets [0]"),
    ({"a": "F32"}, b"", None, "tensor 'a' is described by a JSON str"),
    ({"a": F32}, b"\0" * 4, None, "tensor 'a' ends at byte 8 of the data section but the file holds only 4"),
    ({"a": F32}, b"\0" * 12, None, "holds 4 bytes after its last tensor"),
    ({"a": F32, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, None,
     "tensor 'b' at bytes [4, 8) overlaps tensor 'a'"),
    ({"a": {**F32, "data_offsets": [4, 12]}}, b"\0" * 12, None, "tensor 'a' starts at byte 4"),
    ({"__metadata__": {"format": 1}, "a": F32}, b"\0" * 8, None, "'__metadata__' entry"),
])
def test_corrupt_safetensors_headers_name_the_file_and_tensor(tmp_path: Path, header: Any, data: bytes,
                                                              length: int | None, words: str) -> None:
    raw_file(tmp_path / "model.safetensors", header, data, length)
    for read in (checkpoint_shapes, read_checkpoint):
        with pytest.raises(CheckpointError) as info:
            read(tmp_path)
        assert words in str(info.value) and str(tmp_path / "model.safetensors") in str(info.value)


def test_a_file_shorter_than_the_length_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x01\x00")
    with pytest.raises(CheckpointError, match="too short"):
        read_checkpoint(tmp_path)


def test_a_truncated_checkpoint_fails_to_load_with_the_file_named(tmp_path: Path, no_model: None) -> None:
    folder = write_checkpoint(tmp_path / "m")
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="the file is truncated") as info:
        load(folder)
    assert info.value.path == path and info.value.field is not None and info.value.field in str(info.value)


def test_valid_edge_cases_of_the_format_are_accepted(tmp_path: Path) -> None:
    header = {"__metadata__": {"format": "pt"}, "empty": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [0, 0]},
              "a": F32, "b": {"dtype": "U8", "shape": [], "data_offsets": [8, 9]}}
    body = json.dumps(header).encode() + b"   "  # the format allows trailing spaces
    raw_file(tmp_path / "model.safetensors", body, b"\0" * 9)
    tensors = read_checkpoint(tmp_path)
    assert {n: tuple(t.shape) for n, t in tensors.items()} == {"empty": (0, 3), "a": (2,), "b": ()}


# ---------------------------------------------------------------------------------------------- shard index
def write_index(folder: Path, weight_map: Any) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _outside_file(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    return raw_file(outside / "secret.safetensors", {"a": F32}, b"\0" * 8)


@pytest.mark.parametrize("shard", ["../outside/secret.safetensors", "ABSOLUTE", "sub/../../outside/secret.safetensors"])
def test_an_index_naming_a_file_outside_the_folder_is_refused(tmp_path: Path, shard: str) -> None:
    secret = _outside_file(tmp_path)
    folder = tmp_path / "m"
    folder.mkdir()
    write_index(folder, {"a": str(secret) if shard == "ABSOLUTE" else shard})
    with pytest.raises(CheckpointError, match="not a file name inside the checkpoint folder") as info:
        checkpoint_shapes(folder)
    assert info.value.path == folder / "model.safetensors.index.json"


def test_a_symlink_leading_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    secret = _outside_file(tmp_path)
    folder = tmp_path / "m"
    folder.mkdir()
    os.symlink(secret, folder / "model-00001.safetensors")
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        checkpoint_shapes(folder)  # found by the *.safetensors glob
    write_index(folder, {"a": "model-00001.safetensors"})
    with pytest.raises(CheckpointError, match="a link to .* outside the checkpoint folder"):
        checkpoint_shapes(folder)


def test_the_hugging_face_cache_layout_still_loads(tmp_path: Path) -> None:
    """``snapshots/<rev>/model.safetensors`` is a link to ``../../blobs/<hash>`` in the hub cache."""
    repo = tmp_path / "models--org--tiny"
    built = write_checkpoint(tmp_path / "built")
    (repo / "blobs").mkdir(parents=True)
    (built / "model.safetensors").rename(repo / "blobs" / "0123abcd")
    snapshot = repo / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/0123abcd", snapshot / "model.safetensors")
    (snapshot / "config.json").write_text((built / "config.json").read_text())
    lm = load(snapshot)
    lm.close()


@pytest.mark.parametrize("index, words", [
    ("{broken", "is not valid JSON"), (json.dumps({"weight_map": []}), "no 'weight_map' object"),
    (json.dumps({"weight_map": {"a": 5}}), "weight_map['a'] is 5"),
    (json.dumps({"weight_map": {"a": "missing.safetensors"}}), "names shard 'missing.safetensors', which is not a file"),
])
def test_a_malformed_index_names_itself(tmp_path: Path, index: str, words: str) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=words.replace("[", r"\[").replace("(", r"\(")):
        checkpoint_shapes(tmp_path)


def test_a_tensor_in_two_shards_is_refused(tmp_path: Path) -> None:
    raw_file(tmp_path / "a.safetensors", {"x": F32}, b"\0" * 8)
    raw_file(tmp_path / "b.safetensors", {"x": F32}, b"\0" * 8)
    write_index(tmp_path, {"x": "a.safetensors", "y": "b.safetensors"})
    with pytest.raises(CheckpointError, match="holds tensor 'x', which a.safetensors holds too"):
        checkpoint_shapes(tmp_path)


# ---------------------------------------------------------------------------------------------- tokenizer files
@pytest.mark.parametrize("text", ["not json at all", "{}", "[1, 2, 3]"])
def test_an_unreadable_tokenizer_json_names_the_file(tmp_path: Path, text: str) -> None:
    pytest.importorskip("tokenizers")
    (tmp_path / "tokenizer.json").write_text(text)
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(tmp_path, (1,), 64)
    assert info.value.path == tmp_path / "tokenizer.json" and "tokenizer.json" in str(info.value)


def test_a_checkpoint_with_a_broken_tokenizer_fails_to_load_with_a_typed_error(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    folder = write_checkpoint(tmp_path / "m")
    (folder / "tokenizer.json").write_text("<html>not a tokenizer</html>")
    with pytest.raises(TokenizerError, match="tokenizer.json"):
        load(folder)


@pytest.mark.parametrize("spec, field", [("{nope", None), ('{"vocab_size": "300"}', "vocab_size"),
                                         ('{"vocab_size": 100}', "vocab_size"),
                                         ('{"vocab_size": 300, "eos_token_id": 300}', "eos_token_id"),
                                         ('{"eos_token_id": true}', "eos_token_id")])
def test_a_bad_byte_tokenizer_spec_names_the_field(tmp_path: Path, spec: str, field: str | None) -> None:
    (tmp_path / "smile_tokenizer.json").write_text(spec)
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(tmp_path, (), 300)
    assert info.value.field == field and "smile_tokenizer.json" in str(info.value)


def test_every_error_is_a_value_error_with_its_file() -> None:
    for cls in (ConfigError, CheckpointError, TokenizerError):
        err = cls("x is wrong", field="x").in_file(Path("/m/f.json"))
        assert isinstance(err, (ModelFileError, ValueError)) and type(err) is cls
        assert str(err) == "/m/f.json: x is wrong" and err.field == "x"
    assert issubclass(RenderBudgetError, ChatTemplateError) and issubclass(ChatTemplateError, ValueError)


# ---------------------------------------------------------------------------------------------- chat templates
MESSAGES = [{"role": "user", "content": "hi"}]
FAST = RenderLimits(seconds=0.3, chars=10_000, range=1000, depth=8)


def render(source: str, limits: RenderLimits = FAST, **variables: Any) -> str:
    pytest.importorskip("jinja2")
    return ChatTemplate(source, {"eos_token": "</s>"}, "hostile.jinja", limits=limits).render(MESSAGES, **variables)


@pytest.mark.parametrize("source, words", [
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{% include 'other.jinja' %}", "no loader"),
    ("{% import 'macros.jinja' as m %}", "no loader"),
    ("{% extends 'base.jinja' %}", "no loader"),
    ("{{ messages.__class__ }}", None),
    ("{{ ''.__class__.__mro__ }}", None),
    ("{{ messages[0].content|no_such_filter }}", "No filter named 'no_such_filter'"),
    ("{{ raise_exception('no system prompt') }}", "refused the conversation: no system prompt"),
    ("{{ messages[0].nope.deeper }}", "refused the conversation"),
    ("{{ (1, 2) + 'x' }}", "TypeError"),
    ("{{ 'a' ~ 2.0 ** 100000 }}", "OverflowError"),
])
def test_render_failures_are_typed_and_name_the_template(source: str, words: str | None) -> None:
    try:
        out = render(source)
    except ChatTemplateError as exc:
        assert "hostile.jinja" in str(exc) and (words is None or words in str(exc))
    else:
        assert words is None and out == ""  # the sandbox's undefined: nothing reached


@pytest.mark.parametrize("source, words", [
    ("{% for i in range(10**9) %}{% endfor %}", "range() of 1000000000 items is over the limit of 1000 (MAX_RANGE)"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "deeper than 8 (MAX_CALL_DEPTH)"),
    ("{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}", "deeper than 8 (MAX_CALL_DEPTH)"),
    ("{{ 'x' * 10**10 }}", "a str repeated 10000000000 times would be 10000000000 characters"),
    ("{{ 10**10 * 'x' }}", "a str repeated 10000000000 times"),
    ("{{ ['x'] * 10**10 }}", "a list repeated 10000000000 times"),
    ("{{ 2 ** 1000000 }}", "(MAX_INT_BITS)"),
    ("{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n }}",
     "(MAX_INT_BITS)"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "the result of ~"),
    ("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "the result of +"),
    ("{% set ns = namespace(l=['x']) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
     "the result of +"),
    ("{% set ns = namespace(l='x') %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
     "a list the template builds"),
    ("{{ 'x'|center(10**10) }}", "center filter's width"),
    ("{{ 'x'.ljust(10**10) }}", "str.ljust's width"),
    ("{{ 'x'.zfill(10**10) }}", "str.zfill's width"),
    ("{{ '\t'.expandtabs(10**10) }}", "expandtabs"),
    ("{{ '{:10000000000}'.format(1) }}", "format spec's width"),
    ("{{ '{:{w}}'.format(1, w=10**10) }}", "nested {} width"),
    ("{{ '%10000000000d' % 1 }}", "% format's width"),
    ("{{ '%*d' % (10**10, 1) }}", "* width"),
    ("{{ '%s'|format('x' * 9999) ~ 'x' * 9999 }}", "MAX_RENDER_CHARS"),
    ("{{ ['x' * 4000, 'y' * 4000, 'z']|join('-' * 2000) }}", "the result of join"),
    ("{{ ('-' * 300).join(['x' * 4900, 'y' * 4900]) }}", "the result of join"),
    ("{{ ('x' * 5000)|replace('', 'yy') }}", "the result of replace"),
    ("{{ ('x' * 5000).replace('x', 'yyy') }}", "the result of replace"),
    ("{{ ('a\nb\n' * 1000)|indent(100) }}", "the result of the indent filter"),
    ("{{ range(10)|batch(10**9, 'x') }}", "batch filter's linecount"),
    ("{{ range(10)|slice(10**9) }}", "slice filter's slices"),
    ("{{ range(1000)|list|tojson(indent=1000) }}", "the result of tojson"),
    ("{{ lipsum(10**6) }}", "lipsum's size"),
    ("{% for i in range(1000) %}{{ 'x' * 20 }}{% endfor %}", "the rendered prompt would be"),
    ("{% for i in range(1000) %}xxxxxxxxxxxxxxxxxxxx{% endfor %}", "the rendered prompt would be"),
    ("{% set s = 'x' * 9000 %}{% set b %}{% for i in range(1000) %}{{ s }}{% endfor %}{% endset %}{{ b|length }}",
     "(PRODUCED_CHARS_FACTOR x MAX_RENDER_CHARS)"),
    ("{% macro m() %}{{ 'x' * 6000 }}{{ 'x' * 6000 }}{% endmacro %}{{ m()|length }}", "a call's result"),
])
def test_render_budgets_stop_growth_with_a_clear_error(source: str, words: str) -> None:
    start = time.monotonic()
    with pytest.raises(RenderBudgetError) as info:
        render(source)
    assert words in str(info.value) and "hostile.jinja" in str(info.value)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("source", [
    "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{% endfor %}{% endfor %}"
    "{% endfor %}",
    "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}{{ '' }}{% endfor %}"
    "{% endfor %}{% endfor %}",
    "{% set s = 'x' * 1000 %}{% for i in range(1000) %}{% for j in range(1000) %}{% if s.startswith('y') %}"
    "{% endif %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(1000) %}{% if n < 3 %}{{ f(n + 1) }}{% endif %}{% endfor %}{% endmacro %}"
    "{{ f(0) }}",
])
def test_long_renders_stop_at_the_deadline(source: str) -> None:
    start = time.monotonic()
    with pytest.raises(RenderBudgetError, match=r"time budget of 0.3 s \(MAX_RENDER_SECONDS\)"):
        render(source, RenderLimits(seconds=0.3, chars=10**6, range=1000, depth=8))
    assert time.monotonic() - start < 3


def test_the_default_limits_are_the_documented_constants() -> None:
    """Templates get ``text.limits``' constants unless told otherwise, and those stop ``range(10**9)`` and
    ``'x' * 10**10`` at once (the deadline itself is exercised with small limits above)."""
    pytest.importorskip("jinja2")
    from smile_llm.text import limits as chat_limits

    assert ChatTemplate("x").limits == RenderLimits(chat_limits.MAX_RENDER_SECONDS, chat_limits.MAX_RENDER_CHARS,
                                                    chat_limits.MAX_RANGE, chat_limits.MAX_CALL_DEPTH)
    for source in ("{% for i in range(10**9) %}{% endfor %}", "{{ 'x' * 10**10 }}"):
        start = time.monotonic()
        with pytest.raises(RenderBudgetError):
            ChatTemplate(source).render(MESSAGES)
        assert time.monotonic() - start < 1
    with pytest.raises(ValueError, match="must be positive"):
        RenderLimits(seconds=0)


# Every operation a template can reach whose cost is superlinear or large at the size limit: none may run past the
# deadline by more than one short step. The sizes make each take seconds to minutes without its check (wordwrap and
# urlize are quadratic, nested lists exponential, a round to -10**9 digits never ends); the budget is small.
STEP = RenderLimits(seconds=0.5, chars=1 << 20, range=100_000, depth=8)
HOSTILE = {
    "wordwrap(1) of a long word": "{{ ('a' * 1000000)|wordwrap(1)|length }}",
    "wordwrap of dashes": "{{ ('-' * 1000000)|wordwrap(5)|length }}",
    "wordwrap with a long wrapstring": "{{ ('a' * 20000)|wordwrap(1, wrapstring='x' * 20000)|length }}",
    "urlize of a run of dots": "{{ ('.' * 20000 ~ 'x.')|urlize|length }}",
    "urlize with a long target": "{{ ('a.com ' * 100000)|urlize(target='x' * 1000)|length }}",
    "sort": "{{ ('a' * 300000)|list|sort|length }}",
    "sort by attribute": "{{ ([{'k': 'x'}] * 60000)|sort(attribute='k')|length }}",
    "dictsort": "{{ dict.fromkeys(range(100000))|dictsort|length }}",
    "groupby": "{{ ([{'k': 'x'}] * 60000)|groupby('k')|length }}",
    "sum of lists": "{{ ([[1]] * 100000)|sum(start=[])|length }}",
    "str.strip of a long set": "{{ ('a' * 1000000).strip('b' * 500000 ~ 'a')|length }}",
    "trim of a long set": "{{ ('a' * 1000000)|trim('b' * 500000 ~ 'a')|length }}",
    "compare shared nested lists": "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(40) %}"
                                   "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}"
                                   "{{ ns.a == ns.b }}",
    "compare lists a lazy filter filled": "{% set x = range(100000)|list %}"
                                          "{{ (range(50000)|map(attribute='k', default=x)|list) == "
                                          "(range(50000)|map(attribute='k', default=x[:])|list) }}",
    "compare what *args collected": "{% set x = range(100000)|list %}"
                                    "{% set a = cycler(*(range(50000)|map(attribute='k', default=x))) %}"
                                    "{% set b = cycler(*(range(50000)|map(attribute='k', default=x[:]))) %}"
                                    "{{ a.items == b.items }}",
    "pprint of nested lists": "{% set ns = namespace(l=range(50000)|list) %}{% for i in range(300) %}"
                              "{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l|pprint|length }}",
    "round to -10**9 digits": "{{ 1|round(-10**9) }}",
    "round up to 10**9 digits": "{{ 1.5|round(10**9, 'ceil') }}",
    "long integers divided": "{% set x = ('f' * 1000000)|int(base=16) %}"
                             "{% set y = (0).from_bytes(('f' * 500000).encode(), 'big') %}{{ x // y }}",
    "bytes repeated": "{{ ('x'.encode() * 10**10)|length }}",
    "bytes.center": "{{ 'x'.encode().center(10**10)|length }}",
    "bytes % with a width": "{{ ('%10000000000d'.encode() % 1)|length }}",
    "int.to_bytes": "{{ (1).to_bytes(10**10, 'big')|length }}",
    "Markup.center": "{{ ('x'|escape).center(10**10)|length }}",
    "str.translate to long strings": "{{ ('a' * 100000).translate({97: 'b' * 100000})|length }}",
    "forceescape, three times": "{{ ('&' * 200000)|forceescape|forceescape|forceescape|length }}",
    "str.format of many fields": "{{ ('{0}' * 300000).format(1)|length }}",
    "str.join of a dict's keys": "{{ ('x' * 10000).join(dict.fromkeys(range(100000)))|length }}",
    "str.encode to punycode": "{{ ('\u0101\u0113' * 100000).encode('punycode')|length }}",
}


@pytest.mark.parametrize("source", HOSTILE.values(), ids=HOSTILE.keys())
def test_no_single_operation_outlives_the_render_budget(source: str) -> None:
    """Refused before it starts (its size or its estimated time) or stopped at the deadline, never later than the
    budget plus one short step (here: twice the budget, plus a margin for a loaded machine)."""
    start = time.monotonic()
    with pytest.raises(RenderBudgetError, match="hostile.jinja"):
        render(source, STEP)
    assert time.monotonic() - start < 2 * STEP.seconds + 1.5


BIG = "a" * (4 << 20)  # the largest user message the server takes


@pytest.mark.parametrize("source, content", [
    ("{{ messages[0].content|wordwrap(1) }}", BIG),
    ("{{ messages[0].content|wordwrap(79) }}", "x-" * (2 << 20)),
    ("{{ messages[0].content|urlize }}", "." * (4 << 20) + "x."),
    ("{{ messages[0].content.strip('b' * 100000 ~ 'a') }}", BIG),
    ("{{ messages[0].content|list|sort|join }}", BIG[: 2 << 20]),
    ("{{ messages[0].content|title }}", "a " * (2 << 20)),
])
def test_filters_on_a_large_message_stay_within_the_budget(source: str, content: str) -> None:
    """A message of up to 4 MiB reaches the template as a variable: a real template's filter on it is bounded."""
    pytest.importorskip("jinja2")
    limits = RenderLimits(seconds=0.5)
    start = time.monotonic()
    with pytest.raises(RenderBudgetError):
        ChatTemplate(source, limits=limits).render([{"role": "user", "content": content}])
    assert time.monotonic() - start < 2 * limits.seconds + 1.5


def test_a_thread_pool_of_hostile_renders_is_free_again_within_the_budget() -> None:
    """Six renders of the wordwrap reproduction fill a pool of four threads; each ends at its deadline, and the pool
    then serves an ordinary render (before, each ran for minutes and the pool stayed full)."""
    pytest.importorskip("jinja2")
    from concurrent.futures import ThreadPoolExecutor, wait

    limits = RenderLimits(seconds=0.5)
    hostile = ChatTemplate("{{ ('a' * 2000000)|wordwrap(1) }}", limits=limits)
    ordinary = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", limits=limits)
    pool = ThreadPoolExecutor(max_workers=4)
    try:
        start = time.monotonic()
        futures = [pool.submit(hostile.render, MESSAGES) for _ in range(6)]
        done, pending = wait(futures, timeout=2 * (2 * limits.seconds) + 3)
        assert not pending
        assert all(isinstance(f.exception(), RenderBudgetError) for f in futures)
        assert pool.submit(ordinary.render, MESSAGES).result(timeout=5) == "hi"
        assert time.monotonic() - start < 2 * (2 * limits.seconds) + 3
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def test_the_profile_function_is_restored_after_a_render() -> None:
    """The render's deadline check borrows the thread's profile function and gives it back, also when it fires."""
    import sys

    def mine(frame: Any, event: str, arg: Any) -> None:
        return None

    sys.setprofile(mine)
    try:
        start = time.monotonic()
        with pytest.raises(RenderBudgetError, match="time budget"):
            render("{{ ('a' * 1000000)|wordwrap(1) }}", STEP)
        assert time.monotonic() - start < 2 * STEP.seconds + 1.5 and sys.getprofile() is mine
        assert render("{{ 'x'|upper }}") == "X" and sys.getprofile() is mine
    finally:
        sys.setprofile(None)


def test_the_deadline_never_fires_inside_a_collectors_callback() -> None:
    """The collector runs its callbacks (and finalizers) inside whatever code allocates. A raise there would be
    swallowed as unraisable, and CPython 3.11 then continues the interrupted render with its profile function
    dropped mid-call: the render fails with a confused error ("'traceback' object is not callable") or the
    process aborts. With collections forced every few allocations and a callback that calls Python code, every
    deadline in a sweep across a sort by key must end as the budget error, with nothing unraisable."""
    import gc
    import logging
    import sys

    def callback(phase: str, info: dict[str, Any]) -> None:
        json.dumps(info)  # Python code of the standard library, called from code that is not the render's

    # and the standard library's code called by the collector itself (on the render's path by its frames alone)
    callbacks = [callback, logging.getLogger("smile_llm.tests.collector").debug]
    unraisable: list[Any] = []
    hook, threshold = sys.unraisablehook, gc.get_threshold()
    sys.unraisablehook = unraisable.append
    gc.callbacks.extend(callbacks)
    gc.set_threshold(20)
    try:
        for i in range(40):
            limits = RenderLimits(seconds=0.002 + i * 0.0015, chars=1 << 20, range=100_000, depth=8)
            with pytest.raises(RenderBudgetError, match="time budget"):
                # a thousand sorts: seconds on any machine, so every deadline of the sweep falls inside it
                render("{% for i in range(1000) %}{{ ([{'k': 'x'}] * 60000)|sort(attribute='k')|length }}"
                       "{% endfor %}", limits)
    finally:
        for c in callbacks:
            gc.callbacks.remove(c)
        gc.set_threshold(*threshold)
        sys.unraisablehook = hook
    assert not unraisable


def test_a_template_that_does_not_parse_is_a_typed_error() -> None:
    with pytest.raises(ChatTemplateError, match="hostile.jinja does not parse"):
        render("{% for %}")


QWEN_LIKE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- "# Tools\\n<tools>" }}{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}{{- "\\n</tools>" }}
{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and
        not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- macro render_args(args) %}{% for k, v in args|dictsort %}{{ k }}={{ v|tojson }}{{ ', ' if not loop.last }}
{%- endfor %}{% endmacro %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\\n<think>\\n' ~ reasoning.strip('\\n') ~ '\\n</think>\\n\\n' ~ content }}
        {%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}
        {%- for call in message.tool_calls or [] %}
            {{- '\\n<tool_call>' ~ call.function.name ~ '(' ~ render_args(call.function.arguments) ~ ')' }}
            {{- '%s/%d' % (call.id|upper, loop.index) }}{{- ' {}:{:>4}'.format(loop.length, loop.revindex) }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\\n<tool_response>\\n' ~ content|indent(2) ~ '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
{{- eos_token.center(9, '*') ~ eos_token|center(7) ~ ('=' * 3) ~ [1, 2]|join('|') ~ 'a-b'.replace('-', '+') ~ (range(3)|list) }}"""
CONVERSATION = [
    {"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": "<think>\nlook it up\n</think>\n\nchecking",
     "tool_calls": [{"id": "c1", "function": {"name": "weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "content": "sunny\nwarm"}, {"role": "user", "content": "thanks ü"}]


@pytest.mark.parametrize("variables", [{}, {"enable_thinking": False}])
def test_templates_within_the_limits_render_as_in_the_plain_sandbox(variables: dict[str, Any]) -> None:
    pytest.importorskip("jinja2")
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    plain.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    want = plain.from_string(QWEN_LIKE).render(messages=CONVERSATION, add_generation_prompt=True, tools=tools,
                                               eos_token="</s>", **variables)
    got = ChatTemplate(QWEN_LIKE, {"eos_token": "</s>"}).render(CONVERSATION, True, tools, **variables)
    assert got == want and "<tool_call>weather(city=\"Paris\", days=2)C1/1 1:   1" in got


EVERY_FILTER = """{%- set d = {'b': 2, 'A': 1, 'c': 0} %}{% set e = {'c': [1, (2, 3)], 'b': 'q'} %}
{% set people = [{'n': 'x', 'a': 3}, {'n': 'Y', 'a': 1},{'n': 'z', 'a': 3}] %}{% macro m(x, y=(1, 2)) %}{{ x }}
{{ y }}{{ varargs }}{% endmacro %}{{ m(1) }}{{ m(*[1, 2, 3]) }}{{ d|dictsort }}
{{ d|dictsort(true, 'value', true) }}{{ people|sort(attribute='a,n') }}{{ people|groupby('a') }}
{{ people|map(attribute='n')|join('|') }}{{ people|selectattr('a', 'gt', 1)|list }}
{{ people|rejectattr('n', 'lower')|list }}{{ people|unique(attribute='a')|list }}{{ people|min(attribute='n') }}
{{ people|max(attribute='a') }}{{ people|sum(attribute='a') }}{{ [[1], [2]]|sum(start=[]) }}
{{ range(7)|batch(3, 'x')|list }}{{ range(7)|slice(3)|list }}{{ 'a b'|wordwrap(1) }}
|{{ ('x' * 30 + ' y ' * 30)|wordwrap(10, wrapstring='/') }}
{{ 'see www.x.com, (https://y.org). a@b.co'|urlize(20, true, '_blank') }}{{ "it's  <b>a</b>"|striptags|title }}
{{ 'abc'|center(9) }}{{ '%s-%d'|format('a', 3) }}{{ 'aXbX'|replace('X', '--', 1) }}{{ 'a\nb'|indent(2, true) }}
{{ ' x '|trim }}{{ 'xxyxx'|trim('x') }}{{ 3.14159|round(2) }}{{ 2.5|round(0, 'floor') }}{{ 'ff'|int(base=16) }}
{{ {'q': 'a b', 'r': 1}|urlencode }}{{ {'k': 'v', 'n': none}|xmlattr }}{{ [3, 1, 2]|sort(reverse=true) }}
{{ 'abc'|list }}{{ e|tojson(indent=1, sort_keys=true) }}{{ e|pprint }}{{ 12345678|filesizeformat }}
{{ 'a b c'|wordcount }}{{ 'héllo'|truncate(4, true, '') }}{{ [1, 2]|reverse|list }}{{ 'abc'|reverse }}
{{ (1, 2) + (3,) }}{{ [0] * 3 }}{{ 2 ** 10 }}{{ 7 - 10 }}{{ 'x' ~ 1 ~ none }}{{ ('{:>5}|{}'.format(1, 'b')) }}
{{ '%5s' % 'q' }}{{ 'a,b'.split(',') }}{{ ' x '.strip() }}{{ 'abc'.encode().hex() }}
{{ (65).to_bytes(1, 'big') }}{{ 'ab'.translate({97: 'zz'}) }}{{ dict(a=1, b=[2]) }}{% for k, v in e.items() %}
{{ loop.cycle('o', 'e') }}{{ k }}{{ v }}{{ loop.length }}{% endfor %}
{%- for p in people|sort(attribute='n', case_sensitive=true) recursive %}{{ p.n }}{% endfor %}
{{ lipsum(1, false, 3, 4)|length > 0 }}"""


def test_every_filter_renders_as_in_the_plain_sandbox() -> None:
    """The checks change no result within the limits: filters, methods, operators, displays and macros."""
    pytest.importorskip("jinja2")
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols])
    plain.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    want = plain.from_string(EVERY_FILTER).render(messages=MESSAGES)
    assert ChatTemplate(EVERY_FILTER).render(MESSAGES) == want and "www.x.com</a>" in want


def test_variables_may_override_the_special_tokens() -> None:
    assert render("{{ eos_token }}|{{ bos_token }}", eos_token="<e>", bos_token="<b>") == "<e>|<b>"


def test_a_tokenizer_config_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    (tmp_path / "tokenizer_config.json").write_text("{'chat_template': 'single quotes'}")
    with pytest.raises(ChatTemplateError, match="tokenizer_config.json is not valid JSON"):
        ChatTemplate.from_folder(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[]")
    with pytest.raises(ChatTemplateError, match="must hold a JSON object"):
        ChatTemplate.from_folder(tmp_path)
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff{{ x }}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ChatTemplateError, match="chat_template.jinja is not UTF-8"):
        ChatTemplate.from_folder(tmp_path)


@pytest.mark.parametrize("kwargs, words", [(5, "got int 5"), ("enable_thinking", "got str"), ([("a", 1)], "list"),
                                           ({1: True}, "keys must be strings"),
                                           ({"messages": []}, "may not set 'messages'")])
def test_chat_template_kwargs_of_the_wrong_type_are_refused_by_name(kwargs: Any, words: str) -> None:
    with pytest.raises(RequestTypeError, match="chat_template_kwargs") as info:
        check_template_kwargs(kwargs)
    assert words in str(info.value) and isinstance(info.value, ValueError)
    assert check_template_kwargs(None) == {} and check_template_kwargs({"enable_thinking": False}) == \
        {"enable_thinking": False}


def test_chat_refuses_bad_template_kwargs_and_hostile_templates(tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    folder = write_checkpoint(tmp_path / "m", config(vocab_size=257, eos_token_id=256))
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}"
                                                "{% if boom is defined %}{{ 1 // 0 }}{% endif %}")
    lm = load(folder)
    try:
        with pytest.raises(RequestTypeError, match="chat_template_kwargs must be a dict"):
            lm.chat(MESSAGES, 2, chat_template_kwargs=5)  # type: ignore[arg-type]
        with pytest.raises(ChatTemplateError, match="chat_template.jinja.*ZeroDivisionError"):
            lm.chat(MESSAGES, 2, chat_template_kwargs={"boom": True})
        assert lm.encode_chat(MESSAGES) == lm.encode("hi")
        assert lm.pool.bound_request_count == 0
    finally:
        lm.close()
