"""Custom masks (token-tree verify windows) in the torch backend, against the float64 reference
(``attention.reference``) under the same mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.attention.reference import reference_paged_attention
from smile_llm.attention.torch.backend import TorchBackend
from smile_llm.speculative.draft_tree import DraftTree, window_mask

from .cases import assert_close, make_case


def tree(parents: list[list[int]]) -> DraftTree:
    p = np.array(parents, dtype=np.int64)
    return DraftTree(torch.zeros(p.shape, dtype=torch.int64), p)


@pytest.mark.parametrize("parents, context, page_size", [
    ([[0, 0, 1, 1, 2, 0]], [37], 4),  # one row: the one-chunk path
    ([[0, 0, 1, 1, 2, 0], [0, 1, 2, 3, 4, 5]], [5, 70], 16),  # a bushy tree and a chain, ragged contexts
    ([[0, 0, 0, 1, 2, 3], [0, 1, 1, 2, 2, 4], [0, 0, 1, 2, 3, 4]], [3, 130, 64], 8),
])
def test_tree_masks_match_the_float64_reference(parents, context, page_size) -> None:
    t = tree(parents)
    q_len = t.size + 1
    kv_lens = [c + q_len for c in context]
    case = make_case(np.random.default_rng(7), kv_lens, [q_len] * len(kv_lens), page_size, hkv=2, group=2, d=16)
    mask = window_mask(t, np.array(context)).numpy()
    backend = TorchBackend()
    backend.plan(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                 qo_indptr=torch.tensor(case.qo_indptr, dtype=torch.int32), causal=False,
                 custom_mask=torch.from_numpy(mask))
    got = backend.run(case.q, case.k, case.v)
    want, _ = reference_paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=case.qo_indptr,
                                        custom_mask=mask)
    assert_close(got, want)
    # a chain is the causal mask: the same result as the causal plan
    chain = tree([list(range(t.size))] * len(kv_lens))
    backend.plan(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                 qo_indptr=torch.tensor(case.qo_indptr, dtype=torch.int32), causal=False,
                 custom_mask=window_mask(chain, np.array(context)))
    as_chain = backend.run(case.q, case.k, case.v)
    backend.plan(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                 qo_indptr=torch.tensor(case.qo_indptr, dtype=torch.int32), causal=True)
    # two computations (a custom mask, the causal limits): equal within float32 rounding (cases.tolerance)
    assert_close(as_chain, backend.run(case.q, case.k, case.v))


def test_a_custom_mask_of_the_wrong_size_or_without_windows_is_refused() -> None:
    case = make_case(np.random.default_rng(1), [10], [3], 4, hkv=1, group=1, d=8)
    backend = TorchBackend()
    with pytest.raises(ValueError, match="sum\\(qo_len \\* kv_len\\) = 30"):
        backend.plan(case.meta, num_qo_heads=1, num_kv_heads=1, head_dim=8,
                     qo_indptr=torch.tensor(case.qo_indptr, dtype=torch.int32), custom_mask=torch.ones(29, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs qo_indptr"):
        backend.plan(case.meta, num_qo_heads=1, num_kv_heads=1, head_dim=8, custom_mask=torch.ones(10, dtype=torch.bool))


def test_window_mask_layout() -> None:
    t = tree([[0, 0, 1]])  # root -> a, b; a -> c
    assert t.depths().tolist() == [[0, 1, 1, 2]]
    mask = window_mask(t, np.array([2])).numpy().reshape(4, 6)
    assert mask.astype(int).tolist() == [[1, 1, 1, 0, 0, 0],
                                         [1, 1, 1, 1, 0, 0],
                                         [1, 1, 1, 0, 1, 0],
                                         [1, 1, 1, 1, 0, 1]]
