"""Token and slot arrays at the API boundary: any int sequence in, int64 out; anything else a ValueError."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import RadixCache
from smile_llm.cache.tokens import as_int_array


@pytest.mark.parametrize(
    "values",
    [[3, 1, 2], (3, 1, 2), np.array([3, 1, 2], dtype=np.int32), np.array([3, 1, 2], dtype=np.uint16),
     torch.tensor([3, 1, 2]), (x for x in (3, 1, 2)), [3, np.int64(1), 2]],
)
def test_int_sequences_become_int64(values: object) -> None:
    arr = as_int_array(values, "tokens")
    assert arr.dtype == np.int64 and arr.tolist() == [3, 1, 2]


@pytest.mark.parametrize(
    "values",
    [[1, True], [np.True_, 1], [1.0, 2.0], [1, 2.5], ["1"], [[1, 2], [3, 4]], np.zeros((2, 2), np.int64), [-3],
     torch.tensor([1.0]), None, 7],
)
def test_everything_else_is_a_value_error(values: object) -> None:
    with pytest.raises(ValueError, match="tokens"):
        as_int_array(values, "tokens")


def test_empty_input_is_an_empty_int64_array() -> None:
    for empty in ([], (), np.zeros(0), torch.zeros(0)):
        arr = as_int_array(empty, "tokens")
        assert arr.dtype == np.int64 and len(arr) == 0


def test_radix_accepts_numpy_page_size_and_generators() -> None:
    cache = RadixCache(np.int64(2))
    cache.insert((t for t in [5, 6, 7, 8]), [10, 11, 12, 13])
    assert cache.page_size == 2 and cache.match_prefix(iter([5, 6, 7, 9])).indices.tolist() == [10, 11]
