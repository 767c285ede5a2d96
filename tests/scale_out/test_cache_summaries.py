"""The router's view of the replicas' caches (``CacheSummaries``) and its choice (``rank_replicas``), without Ray:
complete summaries replace the view, partial ones add to it until a later complete one, stale ones change nothing,
routed prompts count until they expire, dropped replicas are forgotten; the choice follows the longest useful
cached prefix unless the load is too uneven, and the least loaded otherwise."""

from __future__ import annotations

import threading

import pytest

from smile_llm.cache.prefix_hash import page_hashes
from smile_llm.cache.radix import RadixCache
from smile_llm.server.replicas.cache_summaries import CacheSummaries, CacheSummary, rank_replicas

PS = 4


def hashes_of(*seqs: list[int]) -> set[int]:
    tree = RadixCache(PS)
    for i, s in enumerate(seqs):
        tree.insert(s, list(range(100 * i, 100 * i + len(s))))
    return set(tree.page_prefix_hashes())


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


A = list(range(16))  # 4 pages
B = list(range(100, 112))  # 3 pages


def test_complete_summaries_replace_partial_ones_add_and_stale_ones_change_nothing() -> None:
    board = CacheSummaries(clock=Clock())
    board.publish(CacheSummary.of("r1", 5, PS, hashes_of(A), complete=True))
    assert board.page_size == PS and board.version("r1") == 5
    assert board.matched_pages("r1", page_hashes(A, PS)) == 4
    assert board.matched_pages("r1", page_hashes(B, PS)) == 0
    # a response's partial summary (newer stamp) adds B
    board.publish(CacheSummary.of("r1", 6, PS, hashes_of(B), complete=False))
    assert board.matched_pages("r1", page_hashes(B, PS)) == 3
    # an A+B prompt that mixes the two sets still matches only its leading run
    assert board.matched_pages("r1", page_hashes(A + B, PS)) == 4
    # a stale partial summary (stamp below the complete one's) is ignored
    board.publish(CacheSummary.of("r1", 4, PS, hashes_of(list(range(200, 208))), complete=False))
    assert board.matched_pages("r1", page_hashes(list(range(200, 208)), PS)) == 0
    # a later complete summary without A (evicted) and without B: both gone
    board.publish(CacheSummary.of("r1", 7, PS, set(), complete=True))
    assert board.matched_pages("r1", page_hashes(A, PS)) == 0
    assert board.matched_pages("r1", page_hashes(B, PS)) == 0
    # a partial summary taken after it (stamp 9) survives an older complete one arriving late (stamp 8)
    board.publish(CacheSummary.of("r1", 9, PS, hashes_of(B), complete=False))
    board.publish(CacheSummary.of("r1", 8, PS, hashes_of(A), complete=True))
    assert board.matched_pages("r1", page_hashes(B, PS)) == 3
    assert board.matched_pages("r1", page_hashes(A, PS)) == 4
    # an out-of-date complete summary changes nothing
    board.publish(CacheSummary.of("r1", 6, PS, set(), complete=True))
    assert board.version("r1") == 8 and board.matched_pages("r1", page_hashes(A, PS)) == 4
    assert board.sizes() == {"r1": 7}


def test_routed_prompts_count_until_they_expire() -> None:
    clock = Clock()
    board = CacheSummaries(pending_ttl_s=10.0, clock=clock)
    board.publish(CacheSummary.of("r1", 1, PS, set(), complete=True))
    board.routed("r1", page_hashes(A, PS))
    assert board.matched_pages("r1", page_hashes(A + B, PS)) == 4
    clock.now = 9.9
    assert board.matched_pages("r1", page_hashes(A, PS)) == 4
    clock.now = 10.0
    assert board.matched_pages("r1", page_hashes(A, PS)) == 0
    board.routed("r1", page_hashes(A, PS))
    # a complete summary taken before the prefill does not erase it
    board.publish(CacheSummary.of("r1", 2, PS, set(), complete=True))
    assert board.matched_pages("r1", page_hashes(A, PS)) == 4
    clock.now = 20.0
    assert board.matched_pages("r1", page_hashes(A, PS)) == 0


def test_a_summary_travels_as_plain_types() -> None:
    summary = CacheSummary.of("r1", 7, PS, hashes_of(A, B), complete=True)
    stats = summary.as_stats()
    assert {type(v) for v in stats.values()} <= {str, int, bytes, bool}
    back = CacheSummary.from_stats(stats)
    assert (back.replica, back.version, back.page_size, back.complete) == ("r1", 7, PS, True)
    assert sorted(back.hashes.tolist()) == sorted(summary.hashes.tolist()) and len(back.hashes) == 7


def test_dropped_and_departed_replicas_are_forgotten() -> None:
    board = CacheSummaries(clock=Clock())
    for r in ("r1", "r2", "r3"):
        board.publish(CacheSummary.of(r, 1, PS, hashes_of(A), complete=True))
    board.drop("r2")
    assert set(board.sizes()) == {"r1", "r3"} and board.matched_pages("r2", page_hashes(A, PS)) == 0
    board.keep_only({"r3"})
    assert set(board.sizes()) == {"r3"}
    assert board.version("r1") == -1


def test_the_board_is_safe_from_many_threads() -> None:
    board = CacheSummaries(clock=Clock())
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for v in range(200):
                board.publish(CacheSummary.of(f"r{k % 2}", v, PS, hashes_of(A), complete=v % 3 == 0))
                board.routed(f"r{k % 2}", page_hashes(B, PS))
                assert board.matched_pages(f"r{k % 2}", page_hashes(A, PS)) in (0, 4)
                board.sizes()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)


def never() -> float:
    return 0.0


@pytest.mark.parametrize(("loads", "matched", "want"), [
    ({"a": 0, "b": 0}, {}, "a"),  # no prefix known: least loaded (ties in the given order)
    ({"a": 3, "b": 1}, {}, "b"),
    ({"a": 3, "b": 1}, {"a": 5, "b": 0}, "a"),  # a useful prefix wins over a slightly shorter queue
    ({"a": 12, "b": 1}, {"a": 5, "b": 0}, "b"),  # too uneven: least loaded
    ({"a": 9, "b": 1}, {"a": 5, "b": 0}, "a"),  # at the threshold exactly: still the prefix
    ({"a": 0, "b": 4}, {"a": 0, "b": 0}, "a"),
    ({"a": 2, "b": 1}, {"a": 1, "b": 0}, "b"),  # 1 page of 20 is below the 10% ratio: least loaded
    ({"a": 2, "b": 1}, {"a": 2, "b": 0}, "a"),  # 2 of 20 is useful
    ({"a": 2, "b": 1}, {"a": 4, "b": 4}, "b"),  # equal matches: the shorter queue
    ({"a": 1, "b": 2, "c": 0}, {"a": 3, "b": 6, "c": 0}, "b"),  # the longest match
    ({"a": 1, "b": 0}, {"a": 5, "b": 4}, "b"),  # 1 page more than the least loaded holds decides nothing
    ({"a": 1, "b": 0}, {"a": 6, "b": 4}, "a"),  # 2 more does
])
def test_rank_replicas(loads: dict[str, int], matched: dict[str, int], want: str) -> None:
    ranked = rank_replicas(list(loads), loads, matched, 20, 0.1, 8, {}, never)
    assert ranked[0] == [want]
    rest = [g[0] for g in ranked[1:]]
    assert sorted(rest + [want]) == sorted(loads) and all(len(g) == 1 for g in ranked)
    assert [loads[r] for r in rest] == sorted(loads[r] for r in rest)


def test_a_one_page_prompt_needs_its_one_page() -> None:
    loads = {"a": 1, "b": 0}
    assert rank_replicas(["a", "b"], loads, {"a": 1, "b": 0}, 1, 0.1, 8, {}, never)[0] == ["a"]
    assert rank_replicas(["a", "b"], loads, {"a": 0, "b": 0}, 1, 0.1, 8, {}, never)[0] == ["b"]


def test_equal_loads_go_to_the_replica_with_the_least_cached() -> None:
    loads = {"a": 1, "b": 1, "c": 2}
    assert rank_replicas(list(loads), loads, {}, 5, 0.1, 8, {"a": 40, "b": 3, "c": 0}, never) == [["b"], ["a"], ["c"]]
    # a useful prefix still wins over a smaller cache
    assert rank_replicas(list(loads), loads, {"a": 5}, 5, 0.1, 8, {"a": 40, "b": 3}, never)[0] == ["a"]


def test_size_counts_what_has_not_expired() -> None:
    clock = Clock()
    board = CacheSummaries(pending_ttl_s=5.0, clock=clock)
    board.publish(CacheSummary.of("r1", 1, PS, hashes_of(A), complete=True))
    board.publish(CacheSummary.of("r1", 2, PS, hashes_of(B), complete=False))
    board.routed("r1", page_hashes(A + B, PS))
    assert board.size("r1") == 4 + 3 + 7 and board.size("r2") == 0
    clock.now = 5.0
    assert board.size("r1") == 4 + 3
