"""Dense bit packing of small unsigned codes into bytes, along one dimension of a tensor.

Codes of ``bits`` bits are laid out as one little-endian bit stream: code ``j`` of a run occupies
stream bits ``[bits*j, bits*(j+1))`` and byte ``k`` holds stream bits ``8k .. 8k+7`` (least
significant first). So 4-bit codes go two to a byte (code ``2i`` in the low nibble), 2-bit codes
four to a byte (code ``4i+j`` at bits ``2j``), and 3-bit codes eight to three bytes.

>>> import torch
>>> pack_codes(torch.arange(8, dtype=torch.uint8), 3, 0).tolist()
[136, 198, 250]
>>> unpack_codes(torch.tensor([136, 198, 250], dtype=torch.uint8), 3, 0).tolist()
[0, 1, 2, 3, 4, 5, 6, 7]
"""

from __future__ import annotations

from math import gcd

import torch


def run_length(bits: int) -> int:
    """Codes per whole-byte run: the packed dimension must be a multiple of it (2, 8, 4 for 4, 3
    and 2 bits)."""
    return 8 // gcd(8, bits)


def _shifts(count: int, width: int, device: torch.device) -> torch.Tensor:
    return torch.arange(count, dtype=torch.int32, device=device) * width  # int32[count]


def pack_codes(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """codes: uint8, each < 2**bits, with a size along ``dim`` that is a multiple of
    ``run_length(bits)`` -> uint8 of the same shape but ``size * bits / 8`` along ``dim``."""
    per_run, run_bytes = run_length(bits), run_length(bits) * bits // 8
    moved = codes.movedim(dim, -1)
    size = moved.shape[-1]
    assert size % per_run == 0, f"{size} codes do not fill whole bytes at {bits} bits"
    runs = moved.reshape(*moved.shape[:-1], size // per_run, per_run).to(torch.int32)
    words = (runs << _shifts(per_run, bits, codes.device)).sum(-1, dtype=torch.int32)
    packed = (words.unsqueeze(-1) >> _shifts(run_bytes, 8, codes.device)) & 0xFF
    packed = packed.reshape(*moved.shape[:-1], size // per_run * run_bytes).to(torch.uint8)
    return packed.movedim(-1, dim).contiguous()


def unpack_codes(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The inverse of ``pack_codes``: uint8 packed bytes -> uint8 codes (``size * 8 / bits``
    along ``dim``)."""
    per_run, run_bytes = run_length(bits), run_length(bits) * bits // 8
    moved = packed.movedim(dim, -1)
    size = moved.shape[-1]
    assert size % run_bytes == 0, f"{size} bytes are not whole runs at {bits} bits"
    runs = moved.reshape(*moved.shape[:-1], size // run_bytes, run_bytes).to(torch.int32)
    words = (runs << _shifts(run_bytes, 8, packed.device)).sum(-1, dtype=torch.int32)
    codes = (words.unsqueeze(-1) >> _shifts(per_run, bits, packed.device)) & ((1 << bits) - 1)
    codes = codes.reshape(*moved.shape[:-1], size // run_bytes * per_run).to(torch.uint8)
    return codes.movedim(-1, dim).contiguous()
