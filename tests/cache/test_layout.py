"""KvCacheLayout geometry and SGLang's mem-fraction-static sizing (Smile KvCachePoolTest 4-7, reference 2.1 / 4.3)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from smile_llm.cache import KvCacheLayout, SlotCount, StaticKvBudget, compute_static_kv_budget, slots_from_budget

GIB = 1 << 30
MIB = 1 << 20


# ---------------------------------------------------------------------------------------------------------- layout
def test_given_tiny_layout_args_when_of_then_head_dim_and_kv_heads_derived() -> None:
    # Given / When: Smile's tinyLayout(layers, batch, seq) = of(L, 64, 4, 2, B, S)
    layout = KvCacheLayout.of(3, 64, 4, 2, 5, 128)

    # Then
    assert layout == KvCacheLayout(num_layers=3, num_kv_heads=2, head_dim=16, max_batch_size=5, max_seq_len=128)
    assert layout.head_dim == 16
    assert layout.num_kv_heads == 2


def test_given_no_kv_heads_when_of_then_defaults_to_num_heads_and_batch_1_seq_4096() -> None:
    # Given / When
    layout = KvCacheLayout.of(2, 96, 3)

    # Then
    assert layout == KvCacheLayout(num_layers=2, num_kv_heads=3, head_dim=32, max_batch_size=1, max_seq_len=4096)


def test_given_layout_when_mutated_then_frozen() -> None:
    # Given
    layout = KvCacheLayout.of(1, 64, 4, 2, 1, 16)

    # When / Then
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.head_dim = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "args",
    [
        (2, 65, 4, 2, 1, 16),  # dim not divisible by num_heads
        (2, 64, 3, None, 1, 16),  # dim not divisible by num_heads
        (2, 64, 0, None, 1, 16),  # num_heads < 1
        (2, 64, -4, None, 1, 16),  # num_heads < 1
        (2, 0, 4, 2, 1, 16),  # dim < 1
        (-1, 64, 4, 2, 1, 16),  # num_layers < 0
        (2, 64, 4, 0, 1, 16),  # num_kv_heads < 1
        (2, 64, 4, 2, 0, 16),  # max_batch_size < 1
        (2, 64, 4, 2, 1, 0),  # max_seq_len < 1
        (2, 64, 4, 2, 1, -16),  # max_seq_len < 1
    ],
)
def test_given_bad_geometry_when_of_then_value_error(args) -> None:
    # Given / When / Then
    with pytest.raises(ValueError):
        KvCacheLayout.of(*args)


@pytest.mark.parametrize(
    "field",
    ["num_layers", "num_kv_heads", "head_dim", "max_batch_size", "max_seq_len"],
)
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_given_bad_field_when_constructed_then_value_error(field, bad) -> None:
    # Given
    args = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "max_batch_size": 1, "max_seq_len": 16}
    args[field] = bad
    if field == "num_layers" and bad == 0:  # a layout of no layers is valid (a pipeline stage's)
        assert KvCacheLayout(**args).bytes_per_token(torch.float32) == 0
        return

    # When / Then
    with pytest.raises(ValueError, match=field):
        KvCacheLayout(**args)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float32, 2 * 3 * 2 * 16 * 4),  # 768
        (torch.bfloat16, 2 * 3 * 2 * 16 * 2),  # 384
        (torch.float16, 2 * 3 * 2 * 16 * 2),  # 384
        (torch.float8_e4m3fn, 2 * 3 * 2 * 16 * 1),  # 192
    ],
)
def test_given_layout_when_bytes_per_token_then_k_plus_v_over_all_layers(dtype, expected) -> None:
    # Given
    layout = KvCacheLayout.of(3, 64, 4, 2, 1, 16)

    # When
    got = layout.bytes_per_token(dtype)

    # Then
    assert got == expected
    assert {torch.float32: 768, torch.bfloat16: 384, torch.float16: 384, torch.float8_e4m3fn: 192}[dtype] == got


def test_given_qwen_like_layout_when_bytes_per_token_bf16_then_131072() -> None:
    # Given: Smile test 5's bytesPerToken = 2*32*8*128*2
    layout = KvCacheLayout(num_layers=32, num_kv_heads=8, head_dim=128, max_batch_size=1, max_seq_len=8192)

    # When / Then
    assert layout.bytes_per_token(torch.bfloat16) == 131072


# ---------------------------------------------------------------------------------------------------------- budget
def test_given_static_budget_when_used_subtracted_then_slots_match_formula() -> None:
    # Given: Smile test 4: total 40 GiB, used 10 GiB, y = 0.85, 1024 B/token, page 16, batch 1, seq 8192
    total = 40 * GIB
    free = 30 * GIB

    # When
    budget = compute_static_kv_budget(total, free, 0.85, 1024, 16, 1, 8192)

    # Then: static = (long)(total*0.85); soft margin = min(1 GiB, max(512 MiB, total/40)) = 1 GiB
    static = int(total * 0.85)
    assert static == 36_507_222_016
    assert budget == StaticKvBudget(
        total=42_949_672_960,
        used=10 * GIB,
        static_budget=36_507_222_016,
        kv_budget=36_507_222_016 - 10 * GIB - GIB,  # 24_696_061_952
        dynamic_reserve=42_949_672_960 - 36_507_222_016,  # 6_442_450_944
        num_slots=8192,  # 24_117_248 from the budget, capped at max_batch * max_seq
        max_useful_slots=8192,
    )
    assert budget.kv_budget == 24_696_061_952
    assert budget.dynamic_reserve == 6_442_450_944


def test_given_tight_kv_budget_when_compute_then_soft_margin_dropped_and_slots_below_context_cap() -> None:
    # Given: Smile test 5: total 20 GiB, used = (long)(total*0.85) - 512 MiB, 131072 B/token, page 16, seq 8192
    total = 20 * GIB
    used = int(total * 0.85) - 512 * MIB
    assert used == 17_716_740_096

    # When
    budget = compute_static_kv_budget(total, total - used, 0.85, 131072, 16, 1, 8192)

    # Then: the 512 MiB soft margin (total/40 = 512 MiB) does not fit, so it is dropped: kv = static - used = 512 MiB
    assert budget == StaticKvBudget(
        total=21_474_836_480,
        used=17_716_740_096,
        static_budget=18_253_611_008,
        kv_budget=512 * MIB,
        dynamic_reserve=21_474_836_480 - 18_253_611_008,  # 3_221_225_472
        num_slots=4096,  # 512 MiB / 128 KiB
        max_useful_slots=8192,
    )
    assert budget.num_slots < budget.max_useful_slots
    assert budget.num_slots % 16 == 0


def test_given_kv_budget_too_small_when_compute_then_runtime_error() -> None:
    # Given: Smile test 6: total 10 GiB, free 1 GiB, y = 0.5 -> static 5 GiB < used 9 GiB
    # When / Then
    with pytest.raises(RuntimeError, match="too small"):
        compute_static_kv_budget(10 * GIB, 1 * GIB, 0.5, 1024, 16, 1, 8192)


def test_given_total_between_20_and_40_gib_when_compute_then_soft_margin_is_total_over_40_and_page_floored() -> None:
    # Given: total 30 GiB -> soft margin 30 GiB / 40 = 768 MiB; 3 MiB per token, page 16
    total, free = 30 * GIB, 29 * GIB

    # When
    budget = compute_static_kv_budget(total, free, 0.5, 3 * MIB, 16, 4, 8192)

    # Then: kv = 15 GiB - 1 GiB - 768 MiB = 13568 MiB -> 4522 tokens -> floored to 4512 (page 16)
    assert budget == StaticKvBudget(
        total=30 * GIB,
        used=1 * GIB,
        static_budget=15 * GIB,
        kv_budget=13568 * MIB,
        dynamic_reserve=15 * GIB,
        num_slots=4512,
        max_useful_slots=32768,
    )


def test_given_large_total_when_compute_then_soft_margin_capped_at_1_gib() -> None:
    # Given: total 80 GiB -> total/40 = 2 GiB, capped at 1 GiB
    total, free = 80 * GIB, 75 * GIB

    # When
    budget = compute_static_kv_budget(total, free, 0.9, 4096, 16, 1024, 32768)

    # Then
    assert budget == StaticKvBudget(
        total=85_899_345_920,
        used=5 * GIB,
        static_budget=77_309_411_328,
        kv_budget=77_309_411_328 - 5 * GIB - GIB,  # 70_866_960_384
        dynamic_reserve=8_589_934_592,
        num_slots=17_301_504,
        max_useful_slots=33_554_432,
    )


def test_given_exactly_one_page_left_when_compute_then_one_page_of_slots() -> None:
    # Given: static 5 GiB, used = static - one page (1024 B/token * 16) -> the margin is dropped and one page fits
    total = 10 * GIB
    used = 5 * GIB - 16 * 1024

    # When
    budget = compute_static_kv_budget(total, total - used, 0.5, 1024, 16, 1, 8192)

    # Then
    assert budget == StaticKvBudget(
        total=total, used=used, static_budget=5 * GIB, kv_budget=16384, dynamic_reserve=5 * GIB, num_slots=16,
        max_useful_slots=8192,
    )


def test_given_one_byte_short_of_a_page_when_compute_then_runtime_error() -> None:
    # Given
    total = 10 * GIB
    used = 5 * GIB - 16 * 1024 + 1

    # When / Then
    with pytest.raises(RuntimeError):
        compute_static_kv_budget(total, total - used, 0.5, 1024, 16, 1, 8192)


def test_given_mem_fraction_one_when_compute_then_no_dynamic_reserve() -> None:
    # Given / When
    budget = compute_static_kv_budget(64 * GIB, 64 * GIB, 1.0, 1 * MIB, 1, 1, 100)

    # Then: nothing used; margin 1 GiB (64/40 = 1.6 GiB capped); 63 GiB / 1 MiB = 64512 slots, capped at 100
    assert budget == StaticKvBudget(
        total=64 * GIB, used=0, static_budget=64 * GIB, kv_budget=63 * GIB, dynamic_reserve=0, num_slots=100,
        max_useful_slots=100,
    )


@pytest.mark.parametrize(
    ("total", "free", "mem_fraction", "bytes_per_token", "page_size", "max_batch", "max_seq"),
    [
        (0, 0, 0.5, 1024, 16, 1, 64),  # total <= 0
        (-GIB, 0, 0.5, 1024, 16, 1, 64),  # total <= 0
        (10 * GIB, 11 * GIB, 0.5, 1024, 16, 1, 64),  # free > total
        (10 * GIB, -1, 0.5, 1024, 16, 1, 64),  # free < 0
        (10 * GIB, 9 * GIB, 0.0, 1024, 16, 1, 64),  # mem_fraction 0
        (10 * GIB, 9 * GIB, 1.5, 1024, 16, 1, 64),  # mem_fraction > 1
        (10 * GIB, 9 * GIB, -0.5, 1024, 16, 1, 64),  # mem_fraction < 0
        (10 * GIB, 9 * GIB, 0.5, 0, 16, 1, 64),  # bytes_per_token 0
        (10 * GIB, 9 * GIB, 0.5, 1024, 0, 1, 64),  # page_size 0
        (10 * GIB, 9 * GIB, 0.5, 1024, 16, 0, 64),  # max_batch 0
        (10 * GIB, 9 * GIB, 0.5, 1024, 16, 1, 0),  # max_seq 0
    ],
)
def test_given_bad_arguments_when_compute_then_value_error(
    total, free, mem_fraction, bytes_per_token, page_size, max_batch, max_seq
) -> None:
    # Given / When / Then
    with pytest.raises(ValueError):
        compute_static_kv_budget(total, free, mem_fraction, bytes_per_token, page_size, max_batch, max_seq)


# ---------------------------------------------------------------------------------------------------------- slots
def test_given_slots_from_budget_when_page_align_then_respects_cap() -> None:
    # Given: Smile test 7: 100000 B at 100 B/token = 1000 tokens -> 992 page-floored, cap ceil_page(1*64) = 64
    # When
    slots = slots_from_budget(100000, 100, 16, 1, 64)

    # Then
    assert slots == SlotCount(num_slots=64, max_useful_slots=64)


def test_given_budget_below_cap_when_slots_from_budget_then_page_floored() -> None:
    # Given / When: 1000 tokens -> 992; cap ceil_page(2*1000) = 2000
    slots = slots_from_budget(100000, 100, 16, 2, 1000)

    # Then
    assert slots == SlotCount(num_slots=992, max_useful_slots=2000)


def test_given_cap_not_page_multiple_when_slots_from_budget_then_cap_rounded_up() -> None:
    # Given / When: cap ceil_page(3*7 = 21, 16) = 32; budget buys 10**6 tokens
    slots = slots_from_budget(10**8, 100, 16, 3, 7)

    # Then
    assert slots == SlotCount(num_slots=32, max_useful_slots=32)


def test_given_budget_under_one_page_when_slots_from_budget_then_at_least_one_page() -> None:
    # Given / When: 5 tokens' worth of budget at page 16
    slots = slots_from_budget(500, 100, 16, 4, 64)

    # Then
    assert slots == SlotCount(num_slots=16, max_useful_slots=256)
