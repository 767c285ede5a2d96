"""Tiny random Hugging Face checkpoints (Llama, Llama-3 rope scaling, tied Llama, Qwen2, Qwen3) and a tiny
``tokenizer.json``, built once per session with fixed seeds, plus helpers to compare ``smile_llm`` with HF.

Everything is small (hidden 32, 2 layers, vocab 97) so the whole directory runs in seconds on a shared CPU.
Fixtures that need ``transformers`` skip cleanly when it is missing.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from smile_llm.language_model import LanguageModel

VOCAB = 97
# A fixed 22-token prompt (not a multiple of the page sizes used) and a longer one for parity.
PROMPT = [(7 * i + 3) % VOCAB for i in range(22)]
LONG_PROMPT = [(11 * i + 5) % VOCAB for i in range(27)]
GEN_LEN = 12  # greedy tokens compared with HF

# name -> (model_type, extra config kwargs, choose an EOS that greedy decoding reaches)
FAMILY_SPECS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "llama": ("llama", {"num_attention_heads": 4, "num_key_value_heads": 2}, True),
    "llama3": ("llama", {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}, False),
    "llama_tied": ("llama", {"num_attention_heads": 4, "num_key_value_heads": 4, "tie_word_embeddings": True},
                   False),
    "qwen2": ("qwen2", {"num_attention_heads": 4, "num_key_value_heads": 2}, False),
    "qwen3": ("qwen3", {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}, False),
}
FAMILIES = list(FAMILY_SPECS)

TOKENIZER_SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a small model reads a small prompt and writes a small answer",
    "paged attention keeps keys and values in a shared pool",
    "the radix tree remembers every prefix it has seen before",
    "tokens flow from the prompt into the cache one page at a time",
]


@dataclass
class HFModel:
    """One saved tiny checkpoint: its folder, the HF model (float32, eval) and its EOS id (or None)."""

    name: str
    path: Path
    model: Any
    eos: int | None
    _greedy: dict[tuple[tuple[int, ...], int], list[int]] = field(default_factory=dict)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """HF float32 logits ``[S, V]`` of a whole sequence."""
        with torch.no_grad():
            return self.model(torch.tensor([ids])).logits[0].float()

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """HF ``generate(do_sample=False)`` new tokens (a trailing EOS included when produced); cached."""
        key = (tuple(ids), n)
        if key not in self._greedy:
            x = torch.tensor([ids])
            with torch.no_grad():
                out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                          eos_token_id=self.eos, pad_token_id=0)
            self._greedy[key] = out[0, len(ids):].tolist()
        return list(self._greedy[key])

    def load(self, page_size: int = 4, max_seq_len: int = 128, **kwargs: Any) -> LanguageModel:
        return LanguageModel.from_pretrained(self.path, page_size=page_size, max_seq_len=max_seq_len, **kwargs)


def expected_greedy(hf: HFModel, ids: list[int], n: int) -> tuple[list[int], str]:
    """What ``generate`` must return for HF's greedy tokens: the tokens without a trailing EOS, and the reason."""
    toks = hf.greedy(ids, n)
    if hf.eos is not None and toks and toks[-1] == hf.eos:
        return toks[:-1], "stop"
    return toks, "length"


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Re-initialise every parameter with a fixed generator at a scale that gives varied, non-degenerate logits
    (the HF default init makes tiny models repeat one token): norms near 1, small biases and embeddings,
    projections ~1.5/sqrt(fan_in). Norm weights are every 1-D parameter named ``*norm*`` (the MTP head's
    ``pre_fc_norm_embedding`` too)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.2 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.3 * noise)
            else:
                p.copy_(1.5 * noise / math.sqrt(p.shape[1]))


def build_hf_model(name: str, folder: Path, seed: int) -> HFModel:
    transformers = pytest.importorskip("transformers")
    model_type, extra, pick_eos = FAMILY_SPECS[name]
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "qwen3": transformers.Qwen3Config}[model_type]
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "qwen3": transformers.Qwen3ForCausalLM}[model_type]
    kwargs: dict[str, Any] = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                              "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    kwargs.update(extra)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    randomize(model, seed)
    hf = HFModel(name, folder, model, None)
    if pick_eos:  # an EOS that greedy decoding of PROMPT reaches after a few tokens, so "stop" is exercised
        toks = hf.greedy(PROMPT, GEN_LEN)
        hf._greedy.clear()
        k = next(i for i in range(4, len(toks)) if toks[i] not in toks[:i] and toks[i] not in PROMPT)
        hf.eos = toks[k]
        model.config.eos_token_id = hf.eos
        model.generation_config.eos_token_id = hf.eos
    model.save_pretrained(folder, safe_serialization=True)
    return hf


class Zoo:
    """Lazily built, session-cached tiny checkpoints."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.models: dict[str, HFModel] = {}

    def __call__(self, name: str) -> HFModel:
        if name not in self.models:
            seed = 1000 + FAMILIES.index(name)
            self.models[name] = build_hf_model(name, self.factory.mktemp(name), seed)
        return self.models[name]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    pytest.importorskip("transformers")
    return Zoo(tmp_path_factory)


def build_tokenizer() -> Any:
    """A 97-entry BPE ``tokenizers.Tokenizer`` (Metaspace) trained on a few sentences; ``<unk>`` 0, ``<eos>`` 1."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<eos>"], show_progress=False)
    tok.train_from_iterator(TOKENIZER_SENTENCES * 3, trainer)
    assert tok.get_vocab_size() == VOCAB
    return tok


@pytest.fixture(scope="session")
def text_model(zoo: Zoo, tmp_path_factory: pytest.TempPathFactory) -> tuple[HFModel, Any]:
    """The qwen3 checkpoint copied next to a ``tokenizer.json`` of the same vocabulary size."""
    base = zoo("qwen3")
    folder = tmp_path_factory.mktemp("qwen3_text")
    for f in base.path.iterdir():
        shutil.copy(f, folder / f.name)
    tok = build_tokenizer()
    tok.save(str(folder / "tokenizer.json"))
    return HFModel("qwen3_text", folder, base.model, base.eos), tok


def assert_clean(pool: Any) -> None:
    """The pool holds no binding and its ownership/lock invariants hold."""
    pool.check_invariants()
    assert pool.bound_request_count == 0


def max_abs(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    return float((torch.as_tensor(a).float() - torch.as_tensor(b).float()).abs().max())
