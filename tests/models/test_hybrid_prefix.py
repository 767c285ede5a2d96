"""Prefix reuse on hybrid models: a prefix hit restores the DeltaNet state snapshot kept at the matched page-aligned
prefix and skips its prefill, and gives the logits of a full recompute (the same model without snapshots, and
``transformers``). Snapshots are taken wherever a request's tokens cross a page boundary: inside a prefill window
(two masked rule runs), at the end of a plain step, inside an accepted verify window, in chunked and padded batched
prefills; multi-turn chats hit every turn."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.engine import InferenceEngine, SamplingParams
from smile_llm.language_model import LanguageModel

from tests.hf_zoo import expected_greedy
from tests.models.hybrid_models import HYBRID_FAMILIES, HYBRID_PROMPT, hybrid_zoo  # noqa: F401 - fixture
from .test_hybrid_parity import PROMPTS, OracleWithMistakes

PS = 4
TIGHT = 5e-5  # float32: hit against full recompute by the same model (summation order differs)
TOL = 1e-4  # float32: against transformers


def floor_page(n: int) -> int:
    return n // PS * PS


@pytest.fixture(scope="module", params=HYBRID_FAMILIES)
def hf(request, hybrid_zoo):  # noqa: F811 - the fixture above
    return hybrid_zoo(request.param)


@pytest.fixture(scope="module")
def hot(hf):
    model = hf.load(page_size=PS, max_seq_len=160, max_batch_size=4, drafter=None)
    yield model
    model.close()


@pytest.fixture(scope="module")
def cold(hf):
    model = hf.load(page_size=PS, max_seq_len=160, max_batch_size=4, drafter=None, state_snapshots=0)
    yield model
    model.close()


def forward(lm: LanguageModel, rid: int, tokens: list[int], start: int) -> torch.Tensor:
    lm.pool.activate_step(rid)
    return lm.transformer(torch.tensor([tokens]), np.array([start]), lm.pool, lm.backend).logits[0, -1]


def test_a_hit_restores_the_snapshot_taken_inside_a_prefill_window(hot, cold, hf):
    """A 21-token prompt prefilled in one window leaves a snapshot at 20 (inside the window); a longer prompt then
    matches 20 tokens, prefills only the rest, and its logits equal a full recompute's."""
    pool = hot.pool
    (states,) = pool.state_pools
    rid = pool.bind_request(HYBRID_PROMPT, 64)
    first = forward(hot, rid, HYBRID_PROMPT, 0)
    assert states.snapshots.pending_length(rid) == 20
    pool.finish_request(rid, HYBRID_PROMPT)
    assert states.snapshots.cached_count >= 1
    longer = HYBRID_PROMPT + [3, 1, 4, 1, 5, 9]
    rid = pool.bind_request(longer, 64)
    assert pool.matched_prefix_len(rid) == 20
    hit = forward(hot, rid, longer[20:], 20)
    pool.finish_request(rid, longer)
    crid = cold.pool.bind_request(longer, 64)
    assert cold.pool.matched_prefix_len(crid) == 0
    full = forward(cold, crid, longer, 0)
    cold.pool.unbind_request(crid)
    assert (hit - full).abs().max().item() < TIGHT
    assert (hit - hf.logits(longer)[-1]).abs().max().item() < TOL
    assert (first - hf.logits(HYBRID_PROMPT)[-1]).abs().max().item() < TOL  # the split rule's outputs too
    pool.check_invariants()


def test_multi_turn_chat_hits_every_turn_and_equals_a_full_recompute(hot, cold, hf):
    """Each turn's prompt is the whole conversation so far: it matches everything the previous turn wrote, up to the
    last page boundary (snapshots taken by plain decode steps), with tokens and logprobs of a full recompute."""
    history = [(31 * i + 5) % 256 for i in range(11)]
    previous = 0  # tokens the previous turn wrote (prompt and generated, but not its last token)
    for turn in range(4):
        got = hot.generate(history, 7, logprobs=True)
        want = cold.generate(history, 7, logprobs=True)
        assert (got.tokens, got.finish_reason) == (want.tokens, want.finish_reason) == expected_greedy(hf, history, 7)
        np.testing.assert_allclose(got.logprobs, want.logprobs, atol=TOL)
        assert want.stats["cached_tokens"] == 0
        assert got.stats["cached_tokens"] == (floor_page(min(previous, len(history) - 1)) if turn else 0)
        previous = len(history) + len(got.tokens) - (1 if got.finish_reason == "length" else 0)
        history = history + got.tokens + [(turn * 17 + j) % 256 for j in range(5)]  # the next user message
    hot.pool.check_invariants()


def test_chunked_and_padded_batched_prefills_leave_snapshots_that_hit(hf):
    """Prefill chunks ending mid-page and padded prefill batches (rows crossing different boundaries) keep a
    snapshot for each row; the same prompts again hit at their last page boundary with identical greedy output."""
    lm = hf.load(page_size=PS, max_seq_len=160, max_batch_size=4, drafter=None)
    try:
        want = [expected_greedy(hf, p, 6) for p in PROMPTS]
        with InferenceEngine(lm, max_batch_size=4, prefill_tokens_per_step=7) as engine:
            first = [h.result() for h in [engine.submit(p, SamplingParams(max_new_tokens=6)) for p in PROMPTS]]
            again = [h.result() for h in [engine.submit(p, SamplingParams(max_new_tokens=6)) for p in PROMPTS]]
        assert [(c.tokens, c.finish_reason) for c in first] == want
        assert [(c.tokens, c.finish_reason) for c in again] == want
        assert [c.stats["cached_tokens"] for c in again] == [floor_page(len(p) - 1) for p in PROMPTS]
        batch = lm.generate_batch(PROMPTS, 6)  # padded prefill of the unmatched remainders
        assert [(c.tokens, c.finish_reason) for c in batch] == want
        lm.pool.check_invariants()
    finally:
        lm.close()


def test_speculative_rounds_keep_snapshots_from_their_accepted_windows(hf):
    """Verify windows crossing a page boundary leave the state after the boundary when it was accepted: the next
    turn hits what the speculative turn wrote, and greedy output stays plain greedy."""
    lm = hf.load(page_size=PS, max_seq_len=160, max_batch_size=4, drafter=None)
    try:
        prompt = PROMPTS[2]
        want = expected_greedy(hf, prompt, 24)
        spec = LanguageModel(lm.config, lm.transformer, lm.tokenizer, lm.pool, lm.backend, lm.max_seq_len,
                             drafter=OracleWithMistakes({tuple(prompt): want[0]}))
        out = spec.generate(prompt, 24)
        assert (out.tokens, out.finish_reason) == want and out.stats["speculative_rounds"] > 0
        follow = prompt + out.tokens + [1, 2, 3]
        got = lm.generate(follow, 5)
        assert got.stats["cached_tokens"] == floor_page(len(prompt) + len(out.tokens) - 1)
        assert (got.tokens, got.finish_reason) == expected_greedy(hf, follow, 5)
        spec.serving_loop.shutdown()
        lm.pool.check_invariants()
    finally:
        lm.close()


def test_a_small_snapshot_store_evicts_and_misses_but_never_errs(hf):
    """Two snapshot slots for many conversations: older prefixes lose their snapshots (a miss, full prefill), the
    output never changes."""
    lm = hf.load(page_size=PS, max_seq_len=160, max_batch_size=2, drafter=None, state_snapshots=2)
    try:
        prompts = [[(k * 29 + i) % 256 for i in range(14)] for k in range(4)]
        want = [expected_greedy(hf, p, 4) for p in prompts]
        for _ in range(2):
            assert [(c.tokens, c.finish_reason) for c in (lm.generate(p, 4) for p in prompts)] == want
        (states,) = lm.pool.state_pools
        assert states.snapshots.cached_count == 2
        assert lm.pool.stats()["state_snapshots"] == 2
        lm.pool.check_invariants()
    finally:
        lm.close()


def test_the_split_rule_equals_per_row_runs_for_a_padded_batch_with_different_splits():
    """``_rule_split_at`` on a right-padded batch whose rows split at 0, inside and at their end: every output, the
    state at each split and the final state equal separate runs over each row's own real positions."""
    from smile_llm.models.deltanet import recurrent_gated_delta_rule
    from smile_llm.models.gated_deltanet import GatedDeltaNet

    g_ = torch.Generator().manual_seed(7)
    b, s, hk, hv, dk, dv = 3, 40, 2, 4, 8, 8
    q, k = torch.randn(b, s, hk, dk, generator=g_), torch.randn(b, s, hk, dk, generator=g_)
    v = torch.randn(b, s, hv, dv, generator=g_)
    g = -torch.rand(b, s, hv, generator=g_)
    beta = torch.rand(b, s, hv, generator=g_)
    init = torch.randn(b, hv, dk, dv, generator=g_)
    valid = np.array([40, 30, 25])
    split = np.array([0, 13, 25])
    real = torch.arange(s)[None, :] < torch.from_numpy(valid)[:, None]
    out, at_split, final = GatedDeltaNet._rule_split_at(q, k, v, g * real[..., None], beta * real[..., None], init,
                                                        torch.from_numpy(split), real)

    def run(row: int, lo: int, hi: int, state: torch.Tensor):
        r = recurrent_gated_delta_rule(q[row:row + 1, lo:hi], k[row:row + 1, lo:hi], v[row:row + 1, lo:hi],
                                       g[row:row + 1, lo:hi], beta[row:row + 1, lo:hi], state[None],
                                       output_final_state=True, use_qk_l2norm_in_kernel=True)
        return r.output[0], r.final_state[0]

    for row in range(b):
        first_out, mid = run(row, 0, int(split[row]), init[row])
        second_out, end = run(row, int(split[row]), int(valid[row]), mid)
        want = torch.cat([first_out, second_out])
        assert (out[row, : valid[row]] - want).abs().max().item() < 1e-5, row
        assert (at_split[row] - mid).abs().max().item() < 1e-5 and (final[row] - end).abs().max().item() < 1e-5


@pytest.mark.parametrize("kept", [0, 1, 2, 3])
def test_a_snapshot_taken_from_an_accepted_verify_window_is_the_state_at_its_boundary(hot, cold, kept):
    """A 13-token prompt (snapshot at 12), then a verify window at positions 13..16 keeping ``kept`` drafts: the row
    consumed 14 + kept tokens, so its snapshot moves to 16 when that boundary lies in the accepted part (kept >= 2)
    and stays at 12 otherwise. Finishing inserts up to that boundary; a longer prompt then hits it with the logits
    of a full recompute."""
    pool = hot.pool
    (states,) = pool.state_pools
    seq = [(19 * i + 4 + 50 * kept) % 256 for i in range(24)]  # a prompt of its own per case (the pool is shared)
    rid = pool.bind_request(seq[:13], 40)
    assert pool.matched_prefix_len(rid) == 0
    forward(hot, rid, seq[:13], 0)
    assert states.snapshots.pending_length(rid) == 12
    pool.activate_step(rid)
    out = hot.transformer(torch.tensor([seq[13:17]]), np.array([13]), pool, hot.backend, keep_states=True)
    pool.truncate_to(np.array([14 + kept]), np.array([17]))
    out.states.rewind(np.array([kept]))
    boundary = floor_page(14 + kept)
    assert boundary == (16 if kept >= 2 else 12)
    assert states.snapshots.pending_length(rid) == boundary
    pool.finish_request(rid, seq[: 14 + kept + 1])  # the last token's KV is not written
    longer = seq[:boundary] + [7, 7, 7]
    hit_id = pool.bind_request(longer, 40)
    assert pool.matched_prefix_len(hit_id) == boundary
    hit = forward(hot, hit_id, longer[boundary:], boundary)
    pool.unbind_request(hit_id)
    crid = cold.pool.bind_request(longer, 40)
    full = forward(cold, crid, longer, 0)
    cold.pool.unbind_request(crid)
    assert (hit - full).abs().max().item() < TIGHT
    pool.check_invariants()
