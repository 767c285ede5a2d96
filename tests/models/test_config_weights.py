"""ModelConfig parsing, safetensors loading (errors, shards, dtypes, MTP weights) and the tokenizers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from smile_llm.language_model import LanguageModel
from smile_llm.models.checkpoint.config import ModelConfig
from smile_llm.models.transformer import Transformer
from smile_llm.models.checkpoint.config import RopeScaling
from smile_llm.text.tokenizer import ByteTokenizer, HFTokenizer, StreamDecoder, load_tokenizer

from tests.hf_zoo import LONG_PROMPT, PROMPT, assert_clean, build_tokenizer, max_abs

BASE = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4}


def cfg(**kw) -> ModelConfig:
    d = {"model_type": "llama", **BASE}
    d.update(kw)
    return ModelConfig.from_dict({k: v for k, v in d.items() if v is not None})


# ---------------------------------------------------------------------------------------------- ModelConfig
def test_llama_fields():
    c = cfg(num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=2048,
            eos_token_id=[7, 9], bos_token_id=1)
    assert (c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers) == ("llama", 97, 32, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size) == (4, 2, 8, 64)
    assert (c.rms_norm_eps, c.rope_theta, c.max_position_embeddings) == (1e-5, 500000.0, 2048)
    assert c.eos_token_ids == (7, 9) and c.bos_token_id == 1
    assert not c.attention_bias and not c.qk_norm and not c.tie_word_embeddings and c.rope_scaling is None
    assert c.mtp_num_hidden_layers == 0 and c.num_speculative_tokens == 0
    # defaults: no GQA, head_dim from hidden / heads, single eos
    d = cfg(eos_token_id=3)
    assert d.num_key_value_heads == 4 and d.head_dim == 8 and d.eos_token_ids == (3,)
    assert cfg().eos_token_ids == ()
    assert cfg(attention_bias=True).attention_bias
    assert cfg(tie_word_embeddings=True).tie_word_embeddings


def test_qwen2_and_qwen3_fields():
    q2 = cfg(model_type="qwen2", num_key_value_heads=2)
    assert q2.attention_bias and not q2.qk_norm and q2.num_key_value_heads == 2
    q3 = cfg(model_type="qwen3", num_key_value_heads=1, head_dim=16)
    assert q3.qk_norm and not q3.attention_bias and q3.head_dim == 16 and q3.num_key_value_heads == 1
    assert cfg(model_type="Qwen3").model_type == "qwen3"


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_rope_scaling_llama3(key):
    raw = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
    if key == "rope_parameters":  # transformers 5 layout: rope_theta moves inside
        raw["rope_theta"] = 500000.0
    c = cfg(**{key: raw})
    assert c.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    if key == "rope_parameters":
        assert c.rope_theta == 500000.0
    assert cfg(rope_scaling={"type": "default"}).rope_scaling is None
    assert cfg(rope_parameters={"rope_type": "default", "rope_theta": 1e6}).rope_theta == 1e6
    with pytest.raises(ValueError, match="yarn"):
        cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0})


@pytest.mark.parametrize("extra, layers, spec", [
    ({"mtp_num_hidden_layers": 1}, 1, 3),
    ({"num_nextn_predict_layers": 1}, 1, 3),
    ({"mtp_num_hidden_layers": 2, "speculative_config": {"num_speculative_tokens": 2}}, 2, 2),
    ({"mtp_num_hidden_layers": 1, "speculative_config": {"num_speculative_tokens": 7}}, 1, 7),
    ({"mtp_num_hidden_layers": 1, "speculative_config": {"num_speculative_tokens": 12}}, 1, 7),
    ({"mtp_num_hidden_layers": 1, "speculative_config": {"num_speculative_tokens": -4}}, 1, 1),
    ({"mtp_num_hidden_layers": 1, "speculative_config": {}}, 1, 3),
    ({"speculative_config": {"num_speculative_tokens": 5}}, 0, 0),
    ({"mtp_num_hidden_layers": 0, "num_nextn_predict_layers": 0}, 0, 0),
])
def test_mtp_fields(extra, layers, spec):
    c = cfg(model_type="qwen3", **extra)
    assert c.mtp_num_hidden_layers == layers
    assert c.num_speculative_tokens == spec
    if layers == 0:
        assert c.resolve_speculative_tokens(4) == 0
    else:
        assert c.resolve_speculative_tokens(None) == spec
        assert c.resolve_speculative_tokens(2) == 2
        assert c.resolve_speculative_tokens(99) == 7


@pytest.mark.parametrize("bad, match", [
    ({"model_type": "mistral"}, "mistral"),
    ({"model_type": None}, "model_type"),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_attention_heads": None}, "num_attention_heads"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"vocab_size": None}, "vocab_size"),
    ({"intermediate_size": None}, "intermediate_size"),
    ({"num_key_value_heads": 3}, "multiple"),
])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        cfg(**bad)


def test_from_pretrained_reads_file_or_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", **BASE}))
    assert ModelConfig.from_pretrained(tmp_path) == ModelConfig.from_pretrained(tmp_path / "config.json")
    with pytest.raises(FileNotFoundError):
        ModelConfig.from_pretrained(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------- weights
def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        shutil.copy(f, dst / f.name)
    return dst


def _edit(folder: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    fn(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_missing_tensor_is_named(zoo, tmp_path):
    folder = _copy(zoo("qwen2").path, tmp_path / "m")
    name = "model.layers.1.self_attn.k_proj.bias"
    _edit(folder, lambda t: t.pop(name))
    with pytest.raises(ValueError) as info:
        LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=32)
    assert name in str(info.value) and "(16,)" in str(info.value)


def test_unexpected_tensor_is_named(zoo, tmp_path):
    folder = _copy(zoo("qwen2").path, tmp_path / "m")
    _edit(folder, lambda t: t.__setitem__("model.layers.0.extra.weight", torch.zeros(3)))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.extra\.weight"):
        LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=32)


def test_wrong_shape_names_tensor_and_shapes(zoo, tmp_path):
    folder = _copy(zoo("qwen3").path, tmp_path / "m")
    name = "model.layers.0.mlp.up_proj.weight"
    _edit(folder, lambda t: t.__setitem__(name, torch.zeros(48, 32)))
    with pytest.raises(ValueError) as info:
        LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=32)
    msg = str(info.value)
    assert name in msg and "(48, 32)" in msg and "(64, 32)" in msg


def test_missing_lm_head_of_untied_model_is_an_error(zoo, tmp_path):
    folder = _copy(zoo("llama3").path, tmp_path / "m")
    _edit(folder, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match="lm_head.weight"):
        LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=32)


def test_no_safetensors_is_an_error(zoo, tmp_path):
    folder = _copy(zoo("qwen3").path, tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError):
        LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=32)


@pytest.mark.parametrize("family", ["llama_tied", "qwen3"])
def test_sharded_checkpoint_loads_identically(zoo, tmp_path, family):
    hf = zoo(family)
    folder = tmp_path / "sharded"
    hf.model.save_pretrained(folder, safe_serialization=True, max_shard_size="20KB")
    shards = sorted(folder.glob("*.safetensors"))
    assert (folder / "model.safetensors.index.json").is_file() and len(shards) > 1
    one, many = hf.load(), LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=128)
    a, b = dict(one.transformer.named_parameters()), dict(many.transformer.named_parameters())
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert torch.equal(v, b[k]), k  # loading copies the stored values: exact
    assert many.generate(PROMPT, 6).tokens == one.generate(PROMPT, 6).tokens
    assert_clean(many.pool)


def test_bfloat16_load(zoo):
    hf = zoo("qwen3")
    lm = hf.load(dtype=torch.bfloat16)
    assert lm.transformer.dtype == torch.bfloat16 and lm.pool.dtype == torch.bfloat16
    lm.pool.bind_with_prefix(LONG_PROMPT, len(LONG_PROMPT))
    try:
        out = lm.transformer(torch.tensor([LONG_PROMPT]), np.array([0]), lm.pool, lm.backend)
    finally:
        lm.pool.unbind_requests()
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
    assert max_abs(out.logits[0], hf.logits(LONG_PROMPT)) < 0.5
    c = lm.generate(PROMPT, 4)
    assert len(c.tokens) == 4
    assert_clean(lm.pool)


def test_mtp_weights_load_under_mtp_prefix(tmp_path):
    from safetensors.torch import save_file

    hf_cfg = {"model_type": "qwen3", **BASE, "num_key_value_heads": 2, "head_dim": 16,
              "mtp_num_hidden_layers": 1, "speculative_config": {"num_speculative_tokens": 2}}
    config = ModelConfig.from_dict(hf_cfg)
    torch.manual_seed(0)
    src = Transformer(config)
    with torch.no_grad():
        for p in src.parameters():
            p.normal_()
    state = {k: v.contiguous() for k, v in src.state_dict().items()}
    assert any(k.startswith("mtp.pre_fc_norm_embedding") for k in state)
    assert "mtp.fc.weight" in state and "mtp.layers.0.self_attn.q_norm.weight" in state and "mtp.norm.weight" in state
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
    lm = LanguageModel.from_pretrained(tmp_path, page_size=4, max_seq_len=32)
    assert lm.transformer.mtp is not None and lm.config.num_speculative_tokens == 2
    for k, v in lm.transformer.state_dict().items():
        assert torch.equal(v, state[k]), k  # loading copies the stored values: exact
    # without its mtp.* tensors the checkpoint does not match the config
    del state["mtp.fc.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"mtp\.fc\.weight"):
        LanguageModel.from_pretrained(tmp_path, page_size=4, max_seq_len=32)


# ---------------------------------------------------------------------------------------------- tokenizers
TEXTS = ["hello", "héllo wörld", "naïve café – “quotes”", "日本語のテキスト", "emoji 😀🎉 mixed ∑ x²", "\x00\n\t"]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(ids + [256]) == text  # <|endoftext|> decodes to nothing
    assert tok.vocab_size == 257 and tok.eos_token_ids == (256,)


def _stream(tok, ids: list[int]) -> list[str]:
    dec = StreamDecoder(tok)
    return [dec.push(i) for i in ids]


@pytest.mark.parametrize("text", TEXTS)
def test_stream_decoder_byte_level(text):
    tok = ByteTokenizer()
    chunks = _stream(tok, tok.encode(text))
    assert "".join(chunks) == text
    for c in chunks:
        assert "\ufffd" not in c
        c.encode("utf-8")  # whole characters only (a lone surrogate would fail)


def test_stream_decoder_holds_incomplete_character():
    tok = ByteTokenizer()
    euro = "€".encode()
    dec = StreamDecoder(tok)
    assert dec.push(ord("a")) == "a"
    assert dec.push(euro[0]) == "" and dec.push(euro[1]) == ""
    assert dec.push(euro[2]) == "€"
    assert dec.push(ord("b")) == "b"


def test_stream_decoder_invalid_byte_is_not_lost_when_followed():
    """0xff can never complete a character: once more text follows, the replacement character comes out."""
    tok = ByteTokenizer()
    ids = [ord("a"), 0xFF, ord("b")]
    assert "".join(_stream(tok, ids)) == tok.decode(ids) == "a\ufffdb"


def test_stream_decoder_hf_byte_level_bpe():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(["hello world, hello there", "plain ascii text only"] * 5, trainer)

    class Wrapped:  # the HFTokenizer interface without a file
        vocab_size = tok.get_vocab_size()
        eos_token_ids = ()

        def decode(self, ids):
            return tok.decode(ids, skip_special_tokens=True)

    for text in ("hello wörld 😀", "日本 hello €"):
        ids = tok.encode(text).ids
        assert len(ids) > len(text.split())  # non-ASCII characters are split over several byte tokens
        chunks = _stream(Wrapped(), ids)
        assert "".join(chunks) == tok.decode(ids) == text
        assert all("\ufffd" not in c for c in chunks)


def test_load_tokenizer_choices(tmp_path):
    assert isinstance(load_tokenizer(tmp_path, (5,), 97), ByteTokenizer)
    assert load_tokenizer(tmp_path, (5,), 97).eos_token_ids == (5,)
    assert load_tokenizer(tmp_path, (), 300).eos_token_ids == (256,)
    (tmp_path / "smile_tokenizer.json").write_text(json.dumps({"vocab_size": 300, "eos_token_id": 299}))
    t = load_tokenizer(tmp_path, (), 97)
    assert isinstance(t, ByteTokenizer) and t.vocab_size == 300 and t.eos_token_ids == (299,)
    tok = build_tokenizer()
    (tmp_path / "hf").mkdir()
    tok.save(str(tmp_path / "hf" / "tokenizer.json"))
    t2 = load_tokenizer(tmp_path / "hf", (1,), 97)
    assert isinstance(t2, HFTokenizer) and t2.eos_token_ids == (1,)
    ids = t2.encode("the quick brown fox")
    assert ids == tok.encode("the quick brown fox", add_special_tokens=False).ids
    assert t2.decode(ids + [1]) == "the quick brown fox"  # special tokens are skipped


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_alias_the_named_parameters(bias):
    """q/k/v (and gate/up) are row views of one fused weight: an in-place write by name (how checkpoints load)
    reaches the fused matmul, and a dtype change fuses the new tensors again."""
    config = ModelConfig.from_dict({"model_type": "qwen2" if bias else "qwen3", **BASE, "num_key_value_heads": 2,
                                    "head_dim": 16})
    model = Transformer(config)
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert (attn.qkv_bias is not None) == bias
    names = dict(model.named_parameters())
    assert "model.layers.1.self_attn.k_proj.weight" in names and "model.layers.1.mlp.up_proj.weight" in names
    if bias:  # fusing again keeps each parameter's own requires_grad
        attn.v_proj.bias.requires_grad_(False)
        again = model.to(torch.float64).model.layers[1].self_attn
        assert not again.v_proj.bias.requires_grad and again.v_proj.weight.requires_grad
        model.to(torch.float32)
    for m in (model, model.to(torch.bfloat16), model.to(torch.float64)):
        attn, mlp = m.model.layers[1].self_attn, m.model.layers[1].mlp
        assert attn.qkv_weight.dtype == attn.k_proj.weight.dtype == mlp.gate_up_weight.dtype
        with torch.no_grad():
            attn.k_proj.weight.fill_(0.5)
            mlp.up_proj.weight.fill_(-2.0)
            if bias:
                attn.v_proj.bias.fill_(3.0)
        q_rows, kv_rows = attn.q_proj.out_features, attn.k_proj.out_features
        assert bool((attn.qkv_weight[q_rows : q_rows + kv_rows] == 0.5).all())
        assert bool((mlp.gate_up_weight[config.intermediate_size :] == -2.0).all())
        if bias:
            assert bool((attn.qkv_bias[q_rows + kv_rows :] == 3.0).all())
