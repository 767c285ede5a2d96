"""Next-token sampling: greedy at temperature 0 (and below ``GREEDY_TEMPERATURE``), otherwise
temperature-scaled sampling with top-k, nucleus (top-p) and min-p from a seeded generator; logprobs
(of the chosen token, and the most likely alternatives) under the model's raw distribution (before
the request's processors and temperature)."""

from __future__ import annotations

import os

import torch

MASK64 = (1 << 64) - 1
# A temperature below this is greedy (vLLM's _SAMPLING_EPS): dividing logits by it would overflow
# float32 (a temperature of 1e-300 is 0 in float32, giving NaN probabilities), and the distribution
# is one-hot long before.
GREEDY_TEMPERATURE = 1e-5


class PositionalRng:
    """Randomness keyed by (seed, token position, stream) instead of by draw count: the sample for
    position p uses a uniform (``uniform``) or a generator (``at``) derived from ``(seed, p)``
    alone. A seeded request therefore draws the same tokens whether it decodes plainly or
    speculatively with greedy drafts, whatever the prefix cache held and however rounds fell. Seed 0
    picks a random base seed (nondeterministic). Streams: TARGET (the token itself), DRAFT and
    ACCEPT (rejection sampling's draft draws and uniforms)."""

    TARGET, DRAFT, ACCEPT = 0, 1, 2

    def __init__(self, seed: int, device: torch.device) -> None:
        self.seed = seed if seed != 0 else int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
        self._gen = torch.Generator(device=device)

    def uniform(self, position: int, stream: int = 0) -> float:
        """A uniform in [0, 1) for ``position`` and ``stream`` (a splitmix64 hash of the three, 53
        bits): the target's draw at a position (``draw``), with no generator to reseed."""
        x = (self.seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03
             + stream * 0x8CB92BA72F3D8DD7 + 0x632BE59BD9B4E019) & MASK64
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
        return ((x ^ (x >> 31)) >> 11) * 2.0**-53

    def at(self, position: int, stream: int = 0) -> torch.Generator:
        """The generator for ``position`` and ``stream``, freshly seeded (one object, reseeded on
        every call)."""
        mixed = (self.seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9
                 + stream * 0x94D049BB133111EB)
        mixed &= (1 << 64) - 1
        mixed ^= mixed >> 31
        self._gen.manual_seed((mixed & ((1 << 63) - 1)) or 1)
        return self._gen


def probabilities(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0,
                  min_p: float = 0.0) -> torch.Tensor:
    """The distribution sampling draws from, with Hugging Face's warpers in their order:
    ``softmax(logits / temperature)`` over the ``top_k`` largest logits (0: all; ties with the k-th
    kept), restricted to the smallest set of most likely tokens whose mass reaches ``top_p``, then
    without tokens less likely than ``min_p`` times the most likely one (not renormalised; ``draw``
    does not need it). A ``temperature`` below ``GREEDY_TEMPERATURE`` puts all the mass on the
    argmax (greedy). ``[..., V]`` -> ``[..., V]``."""
    if temperature < GREEDY_TEMPERATURE:
        first = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits).scatter_(-1, first, 1.0)
    # shifted so the largest logit is 0: a tiny temperature sends the others to -inf, never to nan
    # or +inf
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly before each token
        drop = before >= top_p
        # the most likely token always stays (a top_p below float precision keeps just it)
        drop[..., 0] = False
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs


def sample(logits: torch.Tensor, temperature: float, top_p: float, uniforms: list[float],
           top_k: int = 0, min_p: float = 0.0) -> torch.Tensor:
    """``logits`` float32 ``[B, V]`` (processed, see ``processors``) -> the chosen tokens, int64
    ``[B]``: the argmax at a temperature below ``GREEDY_TEMPERATURE`` (0 included), else a draw from
    ``probabilities`` with row b's uniform ``uniforms[b]`` (``draw``)."""
    if temperature < GREEDY_TEMPERATURE:
        return logits.argmax(dim=-1)
    return draw(probabilities(logits, temperature, top_p, top_k, min_p), uniforms)


def draw(probs: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """One token per row of ``probs`` ``[B, V]`` (unnormalised, nonnegative), int64 ``[B]``: inverse
    transform sampling with row b's uniform ``uniforms[b]`` in [0, 1) (the first index whose
    cumulative mass, in float64, exceeds ``u * total``, so a token of zero mass is never drawn). One
    batched operation for all rows."""
    cdf = probs.double().cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=torch.float64, device=probs.device)[:, None]
    return torch.searchsorted(cdf, u * cdf[:, -1:],
                              right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)


def top_logprobs(logp: torch.Tensor, k: int) -> dict[int, float]:
    """The ``k`` most likely tokens of a log-distribution ``[V]``, id -> logprob, most likely
    first."""
    values, ids = logp.topk(k)
    return dict(zip(ids.tolist(), values.tolist()))


def logprob_entries(logp: torch.Tensor, targets: list[int], k: int) -> list[dict[int, float]]:
    """For each row of a log-distribution ``[C, V]``: ``targets[i]`` -> its logprob first, then the
    ``k`` most likely tokens (a target among them appears once)."""
    chosen = logp.gather(-1,
                         torch.tensor(targets, device=logp.device)[:, None]).squeeze(-1).tolist()
    entries = [{t: c} for t, c in zip(targets, chosen)]
    if k:
        values, ids = logp.topk(k, dim=-1)
        for entry, row_ids, row_values in zip(entries, ids.tolist(), values.tolist()):
            for t, v in zip(row_ids, row_values):
                entry.setdefault(t, v)
    return entries
