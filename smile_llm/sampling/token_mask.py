"""Token bitmasks as llguidance writes them (one bit per token id, little-endian in int32 words:
token ``t`` is bit ``t % 32`` of word ``t // 32``) and their use on logits: ``mask_logits`` sends
every disallowed token to ``-inf``; ``only_token`` finds a mask that allows exactly one token."""

from __future__ import annotations

import numpy as np
import torch


def mask_words(vocab_size: int) -> int:
    """int32 words of one mask over ``vocab_size`` ids."""
    return (vocab_size + 31) // 32


def allowed(bitmask: np.ndarray, vocab_size: int, device: torch.device) -> torch.Tensor:
    """bool ``[N, vocab_size]`` on ``device``: which tokens ``bitmask`` int32 ``[N, W]`` allows
    (unpacked on the device: the packed words are what crosses to it)."""
    packed = torch.from_numpy(np.ascontiguousarray(bitmask).view(np.uint8)).to(device)
    bits = (packed[..., None] >> torch.arange(8, dtype=torch.uint8, device=device)) & 1
    return bits.reshape(packed.shape[0], -1)[:, :vocab_size].bool()


def mask_logits(logits: torch.Tensor, bitmask: np.ndarray) -> torch.Tensor:
    """float32 ``logits`` ``[N, V]`` with every token ``bitmask`` ``[N, W]`` disallows at ``-inf``
    (a new tensor); ids past the mask's words are disallowed too. On the CPU one ``numpy.where``
    over the unpacked bits (fast for the mostly-empty or mostly-full masks grammars give), on a
    device the bits are unpacked there."""
    vocab = logits.shape[-1]
    width = min(vocab, bitmask.shape[-1] * 32)
    if logits.device.type == "cpu":
        bits = np.zeros((logits.shape[0], vocab), dtype=np.uint8)
        bits[:, :width] = np.unpackbits(np.ascontiguousarray(bitmask).view(np.uint8), axis=-1,
                                        count=width, bitorder="little")
        return torch.from_numpy(np.where(bits.view(bool), logits.float().numpy(),
                                         np.float32(-np.inf)))
    return mask_on_device(logits, bitmask)


def mask_on_device(logits: torch.Tensor, bitmask: np.ndarray) -> torch.Tensor:
    """``mask_logits`` by tensor operations on the logits' device (any device)."""
    vocab = logits.shape[-1]
    width = min(vocab, bitmask.shape[-1] * 32)
    keep = allowed(bitmask, width, logits.device)
    if width < vocab:
        keep = torch.nn.functional.pad(keep, (0, vocab - width), value=False)
    return logits.float().masked_fill(~keep, float("-inf"))


def allowed_count(mask: np.ndarray, vocab_size: int) -> int:
    """How many of the ids below ``vocab_size`` a mask ``[W]`` allows."""
    bits = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8), bitorder="little")
    return int(bits[:vocab_size].sum())


def only_token(mask: np.ndarray) -> int | None:
    """The one token a mask ``[W]`` allows, None when it allows none or several."""
    words = np.flatnonzero(mask)
    if len(words) != 1:
        return None
    word = int(mask[words[0]]) & 0xFFFFFFFF
    if word & (word - 1):
        return None
    return int(words[0]) * 32 + word.bit_length() - 1
