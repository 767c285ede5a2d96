"""``smile.llm.cache.KvCachePool`` as Smile's class (``bridgetest.SmilePoolScenarios``, asserted in
Java): the constructor, ``computeStaticKvBudget``, ``FlashInferKvMetadata`` and its identity, the
graph and prefetch calls, ``truncateTo`` zeroing. Plus the Java values checked against the Python
pool's own: the budget against ``compute_static_kv_budget``, every CSR and fixed buffer against the
tensors the Python pool holds."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

from jpype import JArray, JInt  # noqa: E402 - after require_java

from java_bridge.adapters import KvCachePoolAdapter  # noqa: E402
from smile_llm.cache import KvCachePool, compute_static_kv_budget, slots_from_budget  # noqa: E402

from .test_scenarios import run  # noqa: E402

SCENARIOS = scenario_names("SmilePoolScenarios.java")
NO_POOL = {"staticKvBudgetWhenSmileNumbersThenSglangRule"}


@pytest.mark.parametrize("name", SCENARIOS)
def test_smile_pool_scenario(jvm: Jvm, name: str) -> None:
    log = run(jvm, "SmilePoolScenarios", name)
    assert log[-1].endswith(": 0") == (name in NO_POOL), f"audited pools: {log[-1]}"


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names("bridgetest.SmilePoolScenarios")
    assert sorted(SCENARIOS) == [str(n) for n in names]
    assert len(SCENARIOS) >= 9


BUDGETS = [
    (40 << 30, 30 << 30, 0.85, 1024, 16, 1, 8192),  # Smile's: capped at the context
    # a tight budget: the soft margin is dropped
    (20 << 30, (20 << 30) - (int((20 << 30) * 0.85) - (512 << 20)), 0.85, 131072, 16, 1, 8192),
    (80 << 30, 61 << 30, 0.9, 2 * 36 * 8 * 128 * 2, 64, 16, 32768),
    (8 << 30, 8 << 30, 1.0, 4096, 1, 3, 1000),
]


@pytest.mark.parametrize("args", BUDGETS)
def test_static_kv_budget_is_the_python_functions(jvm: Jvm,
                                                  args: tuple[Any, ...]) -> None:
    java = jvm.cls("smile.llm.cache.KvCachePool").computeStaticKvBudget(*args)
    py = compute_static_kv_budget(*args)
    assert [int(java.total()), int(java.used()), int(java.staticBudget()), int(java.kvBudget()),
            int(java.dynamicReserve()), int(java.numSlots()), int(java.maxUsefulSlots())] == [
        py.total, py.used, py.static_budget, py.kv_budget, py.dynamic_reserve, py.num_slots,
        py.max_useful_slots]


@pytest.mark.parametrize(("args", "java_type", "python_type"), [
    ((10 << 30, 1 << 30, 0.5, 1024, 16, 1, 128), "IllegalStateException", RuntimeError),
    ((10 << 30, 11 << 30, 0.5, 1024, 16, 1, 128), "IllegalArgumentException", ValueError),
    ((10 << 30, 1 << 30, 0.5, 1024, 16, 0, 128), "IllegalArgumentException", ValueError),
])
def test_static_kv_budget_errors_carry_the_python_message(jvm: Jvm, args: tuple[Any, ...],
                                                         java_type: str,
                                                         python_type: type[Exception]) -> None:
    with pytest.raises(python_type) as py:
        compute_static_kv_budget(*args)
    with pytest.raises(jvm.jpype.JClass(f"java.lang.{java_type}")) as java:
        jvm.cls("smile.llm.cache.KvCachePool").computeStaticKvBudget(*args)
    assert str(java.value.getClass().getName()) == f"java.lang.{java_type}"
    assert str(java.value.getMessage()) == str(py.value)


@pytest.mark.parametrize("args", [
    (100_000, 100, 16, 1, 64),  # 1,000 slots from the budget, capped at one request's 64
    (10_000, 100, 16, 4, 1000),  # 100 from the budget, floored to 96
    (10, 100, 16, 4, 1000),  # less than a page: one page
    (1 << 40, 1024, 64, 3, 1000),  # capped at 3,000 rounded up to 3,008
])
def test_slots_from_budget_is_the_python_functions(jvm: Jvm, args: tuple[int, ...]) -> None:
    # Smile's package-private KvCachePool.slotsFromBudget goes through Bridge.slotsFromBudget
    java = [int(x) for x in jvm.cls("smile.llm.python.Bridge").slotsFromBudget(*args)]
    py = slots_from_budget(*args)
    assert java == [py.num_slots, py.max_useful_slots]


def test_slots_from_budget_refuses_bad_sizes_by_name(jvm: Jvm) -> None:
    with pytest.raises(jvm.jpype.JClass("java.lang.IllegalArgumentException"), match="pageSize"):
        jvm.cls("smile.llm.python.Bridge").slotsFromBudget(1000, 10, 0, 1, 64)


def parts(meta: Any) -> list[list[int]]:
    """The Java CSR's values: [indptr, indices, lastPageLen]."""
    return [[int(x) for x in t.intArray()]
            for t in (meta.pagedKvIndptr(), meta.pagedKvIndices(), meta.pagedKvLastPageLen())]


def python_parts(meta: Any) -> list[list[int]]:
    return [t.tolist() for t in (meta.indptr, meta.indices, meta.last_page_len)]


def ints(values: list[int]) -> Any:
    return JArray(JInt)(values)


def test_csrs_and_fixed_buffers_are_the_python_pools(jvm: Jvm) -> None:
    """Every CSR and index buffer Java reads holds the values of the Python pool's own tensors, and
    each pool-owned CSR is the one Java object of its Python CSR."""
    with KvCachePool(1, 128, 2, 16, 16) as pool:
        adapter = KvCachePoolAdapter(pool)
        # the adapter converts to its Java pool, the same one while Java holds it
        java = jvm.cls("bridgetest.SmilePoolScenarios").same(adapter)
        assert java.equals(adapter._java_pool())  # noqa: SLF001
        pool.prefix_reuse_enabled = False
        a, b = pool.bind_request([1], 32), pool.bind_request([2], 48)
        pool.activate_step(a, b)
        step = java.sharedFlashInferMetadata(ints([10, 25]))
        assert parts(step) == python_parts(pool.current_step_metadata())
        assert step.equals(java.currentStepFlashInferMetadata())
        built = java.buildFlashInferMetadata(30)
        assert parts(built) == python_parts(pool.build_flashinfer_metadata(30))
        assert not built.isPoolOwned()

        graph = java.prepareVerifyGraphStep(ints([7, 7]), ints([4, 4]), 3)
        # the graph CSR's indices: the whole fixed buffer, as in Python
        assert parts(graph) == python_parts(pool.verify_graph_metadata())
        assert [int(x) for x in java.verifyGraphIndex(2, 3).longArray()] == \
            pool.verify_graph_index(2, 3).tolist()
        assert [int(x) for x in java.verifyQoIndptrBuf(2, 3).intArray()] == \
            pool.verify_qo_indptr(2, 3).tolist()

        decode = java.prepareDecodeGraphStep(8, ints([7, 7]))
        assert decode.equals(graph)  # one graph CSR, rewritten in place
        assert parts(decode) == python_parts(pool.decode_graph_metadata(2))
        assert [int(x) for x in java.decodeGraphIndex(2).longArray()] == \
            pool.decode_graph_index(2).tolist()

        # a Python call rewrites the step CSR in place: the Java object reads it
        assert pool.seal_length([9, 20])
        assert parts(step)[2] == [9, 4] == python_parts(pool.current_step_metadata())[2]
        pool.unbind_requests()


def test_truncate_with_zeroing_restores_the_switch_and_journals_nothing_else(jvm: Jvm) -> None:
    """``truncateTo(.., true)`` flips the pool's ``zero_rejected_kv`` for one call under the lock; a
    replica replaying the journal makes the same decisions (the switch ends as it began)."""
    calls: list[str] = []
    with KvCachePool(1, 64, 2, 16, 16) as pool:
        adapter = KvCachePoolAdapter(pool)
        java = adapter._java_pool()  # noqa: SLF001
        pool.prefix_reuse_enabled = False
        rid = pool.bind_request([1], 32)
        pool.record_calls(lambda name, args, kwargs: calls.append(name))
        java.truncateTo(0, 0, True)
        assert pool.zero_rejected_kv is False
        assert calls == ["set_zero_rejected_kv", "truncate_to", "set_zero_rejected_kv"]
        calls.clear()
        java.truncateTo(0, 0, False)  # the switch already says so: one plain call
        assert calls == ["truncate_to"]
        pool.record_calls(None)
        pool.unbind_request(rid)


def test_per_layer_formats_and_page_bytes_from_java(jvm: Jvm) -> None:
    """Smile's ``dtypeForLayer``, ``kBlockStrideBytesForLayer`` and ``vBlockStrideBytesForLayer`` on a pool whose
    layers store K and V in different formats (packed low-bit ones included), in the model's layer numbering: the
    Python pool's answers, and a layer the pool does not hold is an ``IllegalArgumentException`` naming its range."""
    import torch
    from jpype import JClass

    from smile_llm.cache.kv_dtype import kv_formats

    formats = kv_formats([{"k": "fp8_e4m3", "v": "nvfp4"}, "int4"], 2, torch.float32)
    with KvCachePool(2, 64, 2, 32, 16, kv_formats=formats, first_layer=3) as pool:
        jpool = KvCachePoolAdapter(pool)._java_pool()
        assert [str(jpool.dtypeForLayer(i)) for i in (3, 4)] == ["k=fp8_e4m3, v=nvfp4", "int4"]
        for i in (3, 4):
            assert int(jpool.kBlockStrideBytesForLayer(i)) == pool.k_block_stride_bytes_for_layer(i)
            assert int(jpool.vBlockStrideBytesForLayer(i)) == pool.v_block_stride_bytes_for_layer(i)
        assert int(jpool.kBlockStrideBytesForLayer(3)) == 16 * 2 * 32  # FP8: a byte an element
        try:
            jpool.dtypeForLayer(0)
        except JClass("java.lang.IllegalArgumentException") as exc:
            message = str(exc.getMessage())
        else:
            pytest.fail("a layer the pool does not hold was answered")
        assert "holds layers [3, 5)" in message
