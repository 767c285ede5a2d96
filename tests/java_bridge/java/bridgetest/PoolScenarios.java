package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import java.util.TreeSet;
import smile.llm.cache.KvCacheExhaustedException;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;

/**
 * Smile's {@code KvCachePoolTest} scenarios that the Java interface can express, run
 * against the Python pool through the bridge, with the values the Python port ({@code tests/cache/
 * test_pool_smile.py}) expects where a Fix rule changed Smile's. Every pool is {@link Audited}: the invariants are
 * checked after every operation. Tensors are {@code [B, S, Hkv=2, D=16]} as in Smile's {@code tinyLayout}.
 */
public final class PoolScenarios {
    static final int H = 2, D = 16;

    private PoolScenarios() {}

    static int[] range(int from, int to) {
        int[] a = new int[to - from];
        for (int i = 0; i < a.length; i++) a[i] = from + i;
        return a;
    }

    // 8.1 #1
    @Scenario
    public static void forTestingPoolPutGetRoundTrip(List<String> log) {
        try (KvCachePool pool = Audited.forTesting(2, H, D, 1, 32)) {
            eq(32, pool.numSlots(), "numSlots");
            eq(1, pool.pageSize(), "pageSize");
            eq(2, pool.numLayers(), "numLayers");
            eq(H, pool.numKvHeads(), "numKvHeads");
            eq(D, pool.headDim(), "headDim");
            eq("torch.float32", pool.dtype(), "dtype");
            int[] ids = pool.bindRequests(1, 16);
            eq(1, ids.length, "bindRequests ids");
            eq(16, pool.requestCapacity(), "requestCapacity");
            int[] start = {0};
            pool.put(0, 0, 4, Kv.pattern(start, 4, H, D, false), Kv.pattern(start, 4, H, D, true));
            ByteBuffer[] kv = Kv.get(pool, 0, 4);
            Kv.checkPattern(kv[0], 4, H, D, 0, 0, 0, 4, false, "K");
            Kv.checkPattern(kv[1], 4, H, D, 0, 0, 0, 4, true, "V");
            eq(4, pool.kvLen(ids[0]), "kvLen after put");
            // the per-row start overload continues the row
            pool.put(0, new int[] {4}, 2, Kv.pattern(new int[] {4}, 2, H, D, false),
                    Kv.pattern(new int[] {4}, 2, H, D, true));
            kv = Kv.get(pool, 0, 6);
            Kv.checkPattern(kv[0], 6, H, D, 0, 0, 0, 6, false, "K after put(int[])");
            Kv.checkPattern(kv[1], 6, H, D, 0, 0, 0, 6, true, "V after put(int[])");
            eq(6, pool.kvLen(ids[0]), "kvLen after put(int[])");
            log.add("K[0,5,1,15]=" + Kv.at(kv[0], 6, H, D, 0, 5, 1, 15));
        }
    }

    // 8.1 #8
    @Scenario
    public static void boundRequestsWhenUnboundThenPagesReturnToFreeList(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            eq(4, pool.freePages(), "freePages before");
            pool.bindRequests(1, 32);
            eq(2, pool.freePages(), "freePages bound");
            pool.unbindRequests();
            eq(4, pool.freePages(), "freePages after unbindRequests");
            eq(0, pool.boundRequestCount(), "boundRequestCount");
        }
    }

    // 8.1 #9
    @Scenario
    public static void insufficientPagesWhenBindBatchThenThrows(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 16, H, D, 16)) {
            KvCacheExhaustedException e = expect(KvCacheExhaustedException.class, "batch 2",
                    () -> pool.bindRequests(2, 16));
            check(e instanceof IllegalStateException, "KvCacheExhaustedException is an IllegalStateException");
            eq(1, pool.freePages(), "freePages unchanged");
            eq(0, pool.boundRequestCount(), "nothing bound");
            log.add(e.getMessage());
        }
    }

    // 8.1 #10
    @Scenario
    public static void oversizedCapacityWhenBindThenClampsWithoutThrow(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 16, H, D, 16)) {
            pool.bindRequests(1, 64);
            eq(16, pool.requestCapacity(), "requestCapacity");
            eq(0, pool.freePages(), "freePages");
        }
    }

    // 8.1 #11
    @Scenario
    public static void boundCapacityWhenPutBeyondThenDoesNotGrow(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 32, H, D, 16)) {
            int id = pool.bindRequests(1, 16)[0];
            expect(KvCacheExhaustedException.class, "capacity=16", () -> Kv.putConst(pool, 0, 16, 1, 1f, 1f));
            eq(1, pool.freePages(), "freePages unchanged");
            eq(16, pool.requestCapacity(), "capacity unchanged");
            eq(0, pool.kvLen(id), "nothing written");
        }
    }

    // 8.1 #12
    @Scenario
    public static void bindWithPrefixWhenCapacityClampedThenPromptStillFits(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 32, H, D, 16)) {
            eq(0, pool.bindWithPrefix(range(1, 9), 256), "matched");
            eq(32, pool.requestCapacity(), "requestCapacity");
        }
    }

    // 8.1 #13
    @Scenario
    public static void bindWithPrefixWhenPromptExceedsPoolThenThrows(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 16, H, D, 16)) {
            expect(IllegalArgumentException.class, "Prompt length 20 exceeds free KV capacity 16",
                    () -> pool.bindWithPrefix(range(0, 20), 64));
            eq(1, pool.freePages(), "freePages unchanged");
            eq(0, pool.boundRequestCount(), "nothing bound");
        }
    }

    // 8.1 #14
    @Scenario
    public static void bindWithPrefixWhenFirstRequestThenMissThenHitOnRepeat(List<String> log) {
        try (KvCachePool pool = Audited.forTesting(1, H, D, 1, 64)) {
            int[] prompt = {10, 20, 30, 40, 50, 60, 70, 80};
            eq(0, pool.bindWithPrefix(prompt, 32), "first bind misses");
            Kv.putConst(pool, 0, 0, 8, 1f, 3f);
            pool.finishRequest(prompt);
            // Fix "match capped below the last prompt token": Smile returns 8, here floor_page(8 - 1) = 7
            eq(7, pool.bindWithPrefix(prompt, 32), "second bind hits");
            eq(7, pool.prefixMatchTokens(), "prefixMatchTokens");
            eq(16, pool.prefixPromptTokens(), "prefixPromptTokens");
            ByteBuffer[] kv = Kv.get(pool, 0, 7);
            eq(3.0, Kv.at(kv[1], 7, H, D, 0, 0, 0, 0), "V[0,0,0,0]");
            eq(1.0, Kv.at(kv[0], 7, H, D, 0, 6, 1, 15), "K[0,6,1,15]");
        }
    }

    // 8.1 #15
    @Scenario
    public static void bindWithPrefixWhenDisabledThenAlwaysMiss(List<String> log) {
        try (KvCachePool pool = Audited.forTesting(1, H, D, 1, 64)) {
            pool.setPrefixReuseEnabled(false);
            check(!pool.isPrefixReuseEnabled(), "reuse off");
            int[] prompt = range(1, 9);
            eq(0, pool.bindWithPrefix(prompt, 32), "first bind");
            Kv.putConst(pool, 0, 0, 8, 1f, 1f);
            pool.finishRequest(prompt);
            eq(0, pool.radixCache().totalSize(), "tree empty");
            eq(0, pool.prefixInsertTokens(), "prefixInsertTokens");
            eq(0, pool.bindWithPrefix(prompt, 32), "second bind misses");
            eq(0, pool.prefixPromptTokens(), "prefixPromptTokens");
        }
    }

    // 8.1 #16
    @Scenario
    public static void finishRequestWhenPrefixRetainedThenFreePagesStayBelowFull(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 1)) {
            int[] prompt = range(100, 108);
            pool.bindWithPrefix(prompt, 16);
            Kv.putConst(pool, 0, 0, 8, 1f, 1f);
            pool.finishRequest(prompt);
            eq(56, pool.freePages(), "8 pages retained by the tree, 8 headroom pages freed");
            eq(8, pool.prefixInsertTokens(), "prefixInsertTokens");
            eq(8, pool.radixCache().totalSize(), "tree tokens");
            eq(0, pool.boundRequestCount(), "unbound");
        }
    }

    // Fix "insert only written KV"
    @Scenario
    public static void finishRequestWhenKvNotWrittenThenNothingInserted(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 1)) {
            int[] prompt = range(100, 108);
            pool.bindWithPrefix(prompt, 16);
            Kv.putConst(pool, 0, 0, 5, 1f, 1f);
            pool.finishRequest(new int[] {100, 101, 102, 103, 104, 105, 106, 107, 1, 2});
            eq(5, pool.prefixInsertTokens(), "prefixInsertTokens");
            eq(5, pool.radixCache().totalSize(), "tree tokens");
            eq(59, pool.freePages(), "freePages");
        }
    }

    // 8.1 #17
    @Scenario
    public static void twoBoundRequestsWhenActivateAndUnbindOneThenOtherRemains(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 1)) {
            pool.setPrefixReuseEnabled(false);
            int id1 = pool.bindRequest(new int[] {1, 2, 3, 4}, 16);
            int id2 = pool.bindRequest(new int[] {1, 2, 3, 4}, 16);
            check(id1 > 0 && id2 > id1, "ids positive and increasing: " + id1 + ", " + id2);
            eq(2, pool.boundRequestCount(), "two bound");
            pool.activateStep(id1, id2);
            eq(new int[] {id1, id2}, pool.activeRequestIds(), "activeRequestIds");
            Kv.putConst(pool, 0, 0, 2, 4f, 4f);
            pool.unbindRequest(id1);
            eq(1, pool.boundRequestCount(), "one bound");
            eq(0, pool.requestCapacity(), "the active step was cleared");
            check(!pool.isBound(id1) && pool.isBound(id2), "isBound");
            pool.activateStep(id2);
            ByteBuffer[] kv = Kv.get(pool, 0, 2);
            Kv.checkConst(kv[1], 2, H, D, 0, 0, 2, 4f, "V of the remaining request");
            pool.unbindRequest(id2);
            eq(0, pool.boundRequestCount(), "none bound");
            eq(64, pool.freePages(), "all pages free");
        }
    }

    // 8.1 #18
    @Scenario
    public static void bindRequestWhenUnbindRequestThenFreeSlotsIncrease(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id = pool.bindRequest(new int[] {1, 2, 3}, 32);
            eq(32, pool.freeSlots(), "freeSlots bound");
            eq(1, pool.boundRequestCount(), "one bound");
            pool.unbindRequest(id);
            eq(64, pool.freeSlots(), "freeSlots unbound");
            eq(0, pool.boundRequestCount(), "none bound");
            pool.unbindRequest(id); // unknown ids do nothing
            expect(IllegalArgumentException.class, "Unknown request id", () -> pool.kvLen(id));
            eq(0, pool.matchedPrefixLen(id), "matchedPrefixLen of an unknown id");
        }
    }

    // 8.1 #19
    @Scenario
    public static void fragmentedFreeListWhenBindRequestThenAllocSucceeds(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 256, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int[] ids = new int[4];
            for (int i = 0; i < 4; i++) ids[i] = pool.bindRequest(new int[] {1}, 64);
            eq(0, pool.freeSlots(), "pool full");
            pool.unbindRequest(ids[0]);
            pool.unbindRequest(ids[2]);
            eq(128, pool.freeSlots(), "two holes");
            int id = pool.bindRequest(new int[] {1}, 96);
            eq(32, pool.freeSlots(), "six pages taken");
            pool.activateStep(id);
            Kv.putConst(pool, 0, 0, 96, 7f, 7f);
            ByteBuffer[] kv = Kv.get(pool, 0, 96);
            Kv.checkConst(kv[1], 96, H, D, 0, 0, 96, 7f, "V");
            TreeSet<Long> pages = new TreeSet<>();
            for (long s : pool.slotIndices(96)) pages.add(s / 16);
            eq("[0, 1, 2, 3, 8, 9]", pages.toString(), "pages: FIFO, the first hole then the second");
            for (int i : new int[] {ids[1], ids[3], id}) pool.unbindRequest(i);
            eq(256, pool.freeSlots(), "all free");
            eq(0, pool.boundRequestCount(), "none bound");
        }
    }

    // 8.1 #20
    @Scenario
    public static void raggedLengthsWhenBuildFlashInferMetadataThenIndptrMatches(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 128, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id1 = pool.bindRequest(new int[] {1}, 32);
            int id2 = pool.bindRequest(new int[] {1}, 48);
            pool.activateStep(id1, id2);
            int[][] csr = Kv.csr(pool.buildFlashInferMetadata(new int[] {10, 25}));
            eq(3, csr.length, "{indptr, indices, lastPageLen}");
            eq(new int[] {0, 1, 3}, csr[0], "indptr");
            eq(new int[] {10, 9}, csr[2], "lastPageLen");
            long[] slots = pool.slotIndices(25); // row-major, 25 positions per row
            eq(new int[] {(int) (slots[0] / 16), (int) (slots[25] / 16), (int) (slots[25 + 16] / 16)}, csr[1],
                    "indices: the rows' pages in order");
            int[][] shared = Kv.csr(pool.sharedFlashInferMetadata(new int[] {10, 25}));
            for (int i = 0; i < 3; i++) eq(csr[i], shared[i], "shared CSR part " + i);
            pool.clearStepMetadata();
        }
    }

    // 8.1 #21
    @Scenario
    public static void raggedPutWhenBuildMetadataThenLastPageLensMatchPositions(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 128, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id1 = pool.bindRequest(new int[] {1}, 64);
            int id2 = pool.bindRequest(new int[] {1}, 64);
            pool.activateStep(id1, id2);
            int[] start = {9, 24};
            pool.put(0, start, 1, Kv.pattern(start, 1, H, D, false), Kv.pattern(start, 1, H, D, true));
            int[][] csr = Kv.csr(pool.buildFlashInferMetadata(new int[] {10, 25}));
            eq(new int[] {0, 1, 3}, csr[0], "indptr");
            eq(new int[] {10, 9}, csr[2], "lastPageLen");
            ByteBuffer[] kv = Kv.get(pool, 0, 25);
            eq(Kv.value(0, 9, 1, 3, false), Kv.at(kv[0], 25, H, D, 0, 9, 1, 3), "row 0 K at 9");
            eq(Kv.value(1, 24, 0, 15, true), Kv.at(kv[1], 25, H, D, 1, 24, 0, 15), "row 1 V at 24");
        }
    }

    // 8.1 #22
    @Scenario
    public static void cacheLenWhenStepsUntilPageBoundaryThenMatchesPageSize(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            eq(15, pool.stepsUntilPageBoundary(481), "481");
            eq(1, pool.stepsUntilPageBoundary(495), "495");
            eq(0, pool.stepsUntilPageBoundary(496), "496");
            eq(15, pool.stepsUntilPageBoundary(497), "497");
            eq(497, pool.firstCacheLenInNextPageBucket(31), "firstCacheLenInNextPageBucket(31)");
            eq(32, pool.numPagesForLength(497), "numPagesForLength(497)");
            eq(31, pool.numPagesForLength(496), "numPagesForLength(496)");
            eq(0, pool.numPagesForLength(0), "numPagesForLength(0)");
        }
    }

    // 8.1 #26 (zeroing of rejected KV is off by default: the tail keeps its values until invalidateRange)
    @Scenario
    public static void speculativeWindowWhenTruncateToThenSealsLengthAndKvLen(List<String> log) {
        try (KvCachePool pool = Audited.pool(2, 64, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id = pool.bindRequests(1, 32)[0];
            for (int layer = 0; layer < 2; layer++) Kv.putConst(pool, layer, 0, 20, 1f, 3f);
            eq(20, pool.kvLen(id), "kvLen after the window");
            eq(new int[] {4}, pool.sharedFlashInferMetadata(new int[] {20}).pagedKvLastPageLen().intArray(),
                    "lastPageLen at 20");
            check(pool.truncateTo(new int[] {17}, new int[] {20}), "truncateTo keeps the page count: bumped");
            eq(17, pool.kvLen(id), "kvLen sealed to 17");
            eq(new int[] {1}, pool.sharedFlashInferMetadata(new int[] {17}).pagedKvLastPageLen().intArray(),
                    "lastPageLen at 17");
            ByteBuffer[] kv = Kv.get(pool, 0, 20);
            eq(1.0, Kv.at(kv[0], 20, H, D, 0, 16, 0, 0), "K[16] kept");
            pool.invalidateRange(new int[] {17}, new int[] {20});
            kv = Kv.get(pool, 1, 20);
            eq(1.0, Kv.at(kv[0], 20, H, D, 0, 16, 0, 0), "layer 1 K[16]");
            eq(0.0, Kv.at(kv[0], 20, H, D, 0, 17, 0, 0), "layer 1 K[17] zeroed");
            eq(0.0, Kv.at(kv[0], 20, H, D, 0, 19, 1, 15), "layer 1 K[19] zeroed");
            eq(0.0, Kv.at(kv[1], 20, H, D, 0, 18, 0, 0), "layer 1 V[18] zeroed");
            check(!pool.sealLength(new int[] {10}), "sealing into another page count rebuilds");
            eq(10, pool.kvLen(id), "kvLen sealed to 10");
            eq(new int[] {0, 1}, pool.sharedFlashInferMetadata(new int[] {10}).pagedKvIndptr().intArray(),
                    "indptr at 10");
            expect(IllegalArgumentException.class, null, () -> pool.truncateTo(new int[] {12}, new int[] {11}));
            eq(10, pool.kvLen(id), "a failed truncateTo changes nothing");
        }
    }

    // 8.1 #27
    @Scenario
    public static void truncateToWhenWrittenEqualsSealedThenNoOpInvalidate(List<String> log) {
        try (KvCachePool pool = Audited.forTesting(1, H, D, 1, 16)) {
            int id = pool.bindRequests(1, 8)[0];
            Kv.putConst(pool, 0, 0, 4, 1f, 1f);
            pool.truncateTo(new int[] {4}, new int[] {4});
            eq(4, pool.kvLen(id), "kvLen");
            eq(1.0, Kv.at(Kv.get(pool, 0, 4)[0], 4, H, D, 0, 0, 0, 0), "K[0]");
        }
    }

    // continuous batching: finishRequest inserts, the second bind of the same prompt hits
    @Scenario
    public static void bindRequestWhenSecondBindThenPrefixMatchedAndKvShared(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 1)) {
            int[] prompt = range(1, 9);
            int id1 = pool.bindRequest(prompt, 16);
            eq(0, pool.matchedPrefixLen(id1), "first bind misses");
            Kv.putConst(pool, 0, 0, 0, 0f, 0f); // an empty write is fine
            pool.put(0, 0, 8, Kv.pattern(new int[] {0}, 8, H, D, false), Kv.pattern(new int[] {0}, 8, H, D, true));
            eq(8, pool.kvLen(id1), "kvLen");
            pool.finishRequest(id1, prompt);
            check(!pool.isBound(id1), "finished request unbound");
            eq(8, pool.radixCache().totalSize(), "tree holds the prompt");
            eq(8, pool.prefixInsertTokens(), "prefixInsertTokens");
            int id2 = pool.bindRequest(prompt, 16);
            check(id2 > id1, "ids are never reused");
            eq(7, pool.matchedPrefixLen(id2), "match capped below the last prompt token");
            eq(7, pool.kvLen(id2), "the matched prefix counts as written");
            eq(7, pool.radixCache().protectedSize(), "the match is locked");
            eq(1, pool.radixCache().evictableSize(), "the rest of the tree is evictable");
            ByteBuffer[] kv = Kv.get(pool, 0, 7);
            Kv.checkPattern(kv[0], 7, H, D, 0, 0, 0, 7, false, "K read through the prefix");
            Kv.checkPattern(kv[1], 7, H, D, 0, 0, 0, 7, true, "V read through the prefix");
            expect(IllegalArgumentException.class, null, () -> Kv.putConst(pool, 0, 3, 1, 9f, 9f));
            pool.put(0, 7, 3, Kv.pattern(new int[] {7}, 3, H, D, false), Kv.pattern(new int[] {7}, 3, H, D, true));
            eq(10, pool.kvLen(id2), "kvLen after the new tokens");
            expect(IllegalArgumentException.class, "matched", () -> pool.finishRequest(id2, new int[] {9, 9}));
            check(pool.isBound(id2), "a rejected finishRequest leaves the request bound");
            pool.finishRequest(id2, new int[] {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
            eq(10, pool.radixCache().totalSize(), "tree grew by the new tokens");
            eq(0, pool.radixCache().protectedSize(), "unlocked");
            eq(54, pool.freePages(), "10 tree pages, the rest free");
            log.add("prefixMatchTokens=" + pool.prefixMatchTokens());
        }
    }

    // KvCacheExhaustedException: nothing changed, so the caller may retry later
    @Scenario
    public static void exhaustedBindWhenRejectedThenStateUnchanged(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            int[] prompt = range(1, 21);
            int a = pool.bindRequest(prompt, 32);
            Kv.putConst(pool, 0, 0, 20, 2f, 2f);
            pool.finishRequest(a, prompt);
            int b = pool.bindRequest(range(50, 60), 32);
            String stats = pool.statsJson();
            int free = pool.freePages(), tree = pool.radixCache().totalSize();
            for (int cap : new int[] {64, 200}) {
                KvCacheExhaustedException e = expect(KvCacheExhaustedException.class, "pages",
                        () -> pool.bindRequest(prompt, cap));
                log.add(e.getMessage());
            }
            expect(KvCacheExhaustedException.class, null, () -> pool.bindRequests(5, 16));
            expect(KvCacheExhaustedException.class, null, () -> pool.alloc(64));
            eq(stats, pool.statsJson(), "statsJson unchanged");
            eq(free, pool.freePages(), "freePages unchanged");
            eq(tree, pool.radixCache().totalSize(), "tree unchanged");
            eq(1, pool.boundRequestCount(), "still one bound");
            check(pool.isBound(b), "b still bound");
            int c = pool.bindRequest(prompt, 32); // evicts nothing: the prefix is reused, one page is free
            eq(16, pool.matchedPrefixLen(c), "retry hits the prefix");
            pool.unbindRequests();
        }
    }

    @Scenario
    public static void activateStepWhenBadIdsThenIllegalArgumentAndStepKept(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id1 = pool.bindRequest(new int[] {1}, 16);
            int id2 = pool.bindRequest(new int[] {2}, 16);
            pool.activateStep(id1, id2);
            int[] active = {id1, id2};
            log.add(expect(IllegalArgumentException.class, "Unknown request id: 999",
                    () -> pool.activateStep(999)).getMessage());
            eq(active, pool.activeRequestIds(), "step kept after an unknown id");
            log.add(expect(IllegalArgumentException.class, "duplicate",
                    () -> pool.activateStep(id1, id1)).getMessage());
            eq(active, pool.activeRequestIds(), "step kept after a duplicate id");
            log.add(expect(IllegalArgumentException.class, "at least one",
                    () -> pool.activateStep()).getMessage());
            eq(active, pool.activeRequestIds(), "step kept after no ids");
            expect(IllegalArgumentException.class, "must not be null", () -> pool.activateStep((int[]) null));
            pool.activateStep(id2);
            eq(new int[] {id2}, pool.activeRequestIds(), "reactivated");
            pool.ensureRequest(1, 16);
            expect(KvCacheExhaustedException.class, "capacity", () -> pool.ensureRequest(1, 17));
            expect(KvCacheExhaustedException.class, "rows", () -> pool.ensureRequest(2, 1));
        }
    }

    @Scenario
    public static void noActiveStepWhenStepVerbThenIllegalState(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            eq(0, pool.activeRequestIds().length, "no active rows");
            eq(0, pool.requestCapacity(), "requestCapacity");
            ByteBuffer b = Kv.floats(H * D);
            IllegalStateException e = expect(IllegalStateException.class, "no active step",
                    () -> pool.put(0, 0, 1, b, b));
            check(!(e instanceof KvCacheExhaustedException), "a plain IllegalStateException");
            expect(IllegalStateException.class, "no active step", () -> pool.get(0, 1, b, b));
            expect(IllegalStateException.class, "No request bound", () -> pool.slotIndices(1));
            expect(IllegalStateException.class, "No request bound", () -> pool.sealLength(new int[] {0}));
            expect(IllegalStateException.class, "No request bound",
                    () -> pool.buildFlashInferMetadata(new int[] {1}));
            expect(KvCacheExhaustedException.class, "No request bound", () -> pool.ensureRequest(1, 1));
        }
    }

    @Scenario
    public static void directBuffersWhenWrongKindThenIllegalArgument(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            pool.bindRequests(1, 16);
            int n = H * D;
            ByteBuffer good = Kv.floats(n);
            ByteBuffer heap = ByteBuffer.allocate(n * 4).order(ByteOrder.nativeOrder());
            ByteOrder other = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN ? ByteOrder.BIG_ENDIAN
                    : ByteOrder.LITTLE_ENDIAN;
            ByteBuffer swapped = ByteBuffer.allocateDirect(n * 4).order(other);
            expect(IllegalArgumentException.class, "direct ByteBuffer", () -> pool.put(0, 0, 1, heap, good));
            expect(IllegalArgumentException.class, "native byte order", () -> pool.put(0, 0, 1, good, swapped));
            expect(IllegalArgumentException.class, "v has 4 bytes remaining (position 0, limit 4), need 128", () -> pool.put(0, 0, 1, good, Kv.floats(1)));
            expect(IllegalArgumentException.class, "must not be null", () -> pool.put(0, 0, 1, null, good));
            expect(IllegalArgumentException.class, "direct ByteBuffer", () -> pool.get(0, 1, heap, good));
            expect(IllegalArgumentException.class, "layer", () -> pool.put(5, 0, 1, good, good));
            eq(0, pool.kvLen(pool.activeRequestIds()[0]), "nothing written");
        }
    }

    @Scenario
    public static void callerPagesWhenAllocFreeEvictThenAccounted(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            long[] slots = pool.alloc(20);
            eq(32, slots.length, "page-aligned caller slots");
            eq(0, slots[0] % 16, "starts a page");
            eq(2, pool.freePages(), "two pages taken");
            expect(IllegalArgumentException.class, null, () -> pool.free(new long[] {slots[0]}));
            pool.free(slots);
            eq(4, pool.freePages(), "returned");
            expect(IllegalArgumentException.class, null, () -> pool.free(slots));
            int[] prompt = range(1, 33);
            int id = pool.bindRequest(prompt, 32);
            Kv.putConst(pool, 0, 0, 32, 1f, 1f);
            pool.finishRequest(id, prompt);
            eq(32, pool.radixCache().evictableSize(), "tree evictable");
            eq(2, pool.freePages(), "tree holds two pages");
            long[] more = pool.alloc(64); // evicts the tree to fit
            eq(0, pool.radixCache().totalSize(), "alloc evicted the tree");
            eq(32, pool.prefixEvictTokens(), "prefixEvictTokens");
            pool.free(more);
            eq(0, pool.evict(16), "nothing left to evict");
        }
    }

    @Scenario
    public static void closedPoolWhenCalledThenIllegalState(List<String> log) {
        KvCachePool pool = Bridge.forTesting(new smile.llm.cache.KvCacheLayout(1, H, D, 1, 8)); // not audited
        pool.bindRequests(1, 8);
        pool.close();
        IllegalStateException e = expect(IllegalStateException.class, "closed", pool::freePages);
        check(!(e instanceof KvCacheExhaustedException), "a plain IllegalStateException");
        expect(IllegalStateException.class, "closed", () -> pool.bindRequest(new int[] {1}, 4));
        expect(IllegalStateException.class, "closed", pool::checkInvariants);
        pool.close(); // idempotent
        log.add(e.getMessage());
    }

    @Scenario
    public static void newKvCachePoolWhenDtypeThenStorageDtype(List<String> log) {
        try (KvCachePool pool = Audited.wrap(Bridge.newKvCachePool(1, 32, H, D, 16, "torch.bfloat16"))) {
            eq("torch.bfloat16", pool.dtype(), "dtype");
            eq(2, pool.freePages(), "pages");
        }
        expect(IllegalArgumentException.class, "dtype must be one of",
                () -> Bridge.newKvCachePool(1, 32, H, D, 16, "int8"));
        expect(IllegalArgumentException.class, null, () -> Bridge.newKvCachePool(1, 32, H, D, 0, "float32"));
        expect(IllegalArgumentException.class, ">= 1", () -> new smile.llm.cache.KvCacheLayout(0, 1, 1, 1, 1));
    }
}
