package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;

import java.util.Arrays;
import java.util.List;
import smile.llm.cache.KvCachePool;
import smile.llm.cache.RadixCache;

/**
 * Smile's {@code RadixCacheTest} scenarios through {@code pool.radixCache()}: the tree
 * is filled the way a JVM application fills it (bind, write the KV, {@code finishRequest}), so the "kv indices"
 * are the slots the request wrote, read back with {@code slotIndices}. Locking is a bound request's match,
 * eviction is {@code pool.evict}. Pools are {@link Audited}.
 */
public final class RadixScenarios {
    static final int H = 1, D = 4;

    private RadixScenarios() {}

    static KvCachePool pool(int pageSize) {
        return Audited.pool(1, 64, H, D, pageSize);
    }

    /** Binds {@code tokens}, writes the KV past the matched prefix, finishes; returns the slots of every token. */
    static int[] insert(KvCachePool pool, int... tokens) {
        int id = pool.bindRequest(tokens, tokens.length);
        int matched = pool.matchedPrefixLen(id);
        pool.activateStep(id);
        if (tokens.length > matched) Kv.putConst(pool, 0, matched, tokens.length - matched, 1f, 2f);
        long[] slots = pool.slotIndices(tokens.length);
        pool.finishRequest(id, tokens);
        int[] out = new int[slots.length];
        for (int i = 0; i < out.length; i++) out[i] = Math.toIntExact(slots[i]);
        return out;
    }

    /** {@code pool.radix().matchPrefix(tokens)}'s slot ids, as ints. */
    static int[] match(KvCachePool pool, int... tokens) {
        long[] slots = pool.radix().matchPrefix(tokens).indices().longArray();
        int[] out = new int[slots.length];
        for (int i = 0; i < out.length; i++) out[i] = Math.toIntExact(slots[i]);
        return out;
    }

    static int[] head(int[] a, int n) {
        return Arrays.copyOf(a, n);
    }

    static void sizes(RadixCache r, int total, int evictable, int locked) {
        eq(total, r.totalSize(), "totalSize");
        eq(evictable, r.evictableSize(), "evictableSize");
        eq(locked, r.protectedSize(), "protectedSize");
    }

    @Scenario
    public static void insertSingleSequenceThenMatchReturnsFullSequence(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            int[] slots = insert(pool, 1, 2, 3);
            eq(slots, match(pool, 1, 2, 3), "match");
            eq(1, pool.radixCache().pageSize(), "pageSize");
            log.add("slots=" + Arrays.toString(slots));
        }
    }

    @Scenario
    public static void insertLongerSequenceThenMatchReturnsCachedPrefix(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            int[] first = insert(pool, 1, 2, 3);
            int id = pool.bindRequest(new int[] {1, 2, 3, 4, 5}, 5);
            eq(3, pool.matchedPrefixLen(id), "prefix length of the longer sequence");
            pool.unbindRequest(id);
            int[] longer = insert(pool, 1, 2, 3, 4, 5);
            eq(first, head(longer, 3), "the longer sequence reuses the cached slots");
            eq(longer, match(pool, 1, 2, 3, 4, 5), "match of the longer sequence");
            eq(5, pool.radixCache().totalSize(), "totalSize");
        }
    }

    @Scenario
    public static void insertDivergingSequencesThenBothAreMatched(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            int[] a = insert(pool, 1, 2, 3);
            int[] b = insert(pool, 1, 2, 4, 5);
            eq(head(a, 2), head(b, 2), "the shared [1, 2] is stored once");
            eq(a, match(pool, 1, 2, 3), "match a");
            eq(b, match(pool, 1, 2, 4, 5), "match b");
            eq(5, pool.radixCache().totalSize(), "totalSize");
        }
    }

    @Scenario
    public static void matchUnknownSequenceThenReturnsEmpty(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            insert(pool, 1, 2, 3);
            eq(new int[0], match(pool, 9, 8, 7), "match");
        }
    }

    @Scenario
    public static void matchPartialPrefixThenReturnsMatchedPortion(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            int[] slots = insert(pool, 1, 2, 3, 4, 5);
            eq(head(slots, 3), match(pool, 1, 2, 3, 9, 9), "match");
        }
    }

    @Scenario
    public static void insertSameSequenceTwiceThenDuplicatesAreFreed(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            int[] first = insert(pool, 1, 2, 3);
            int[] again = insert(pool, 1, 2, 3);
            eq(head(first, 2), head(again, 2), "the second bind reused the prefix");
            eq(3, pool.radixCache().totalSize(), "totalSize");
            eq(first, match(pool, 1, 2, 3), "duplicates were not stored");
            eq(61, pool.freePages(), "the duplicate page was freed");
        }
    }

    @Scenario
    public static void multipleInsertsThenTotalSizeIsCorrect(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            insert(pool, 1, 2, 3);
            insert(pool, 1, 2, 4, 5);
            insert(pool, 1, 2, 4, 5, 6, 7);
            insert(pool, 8, 9, 10);
            sizes(pool.radixCache(), 10, 10, 0);
            eq(54, pool.freePages(), "freePages");
        }
    }

    @Scenario
    public static void boundRequestWhenLockedThenProtectedUntilUnbound(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            insert(pool, 1, 2, 3);
            insert(pool, 4, 5, 6);
            sizes(pool.radixCache(), 6, 6, 0);
            int id = pool.bindRequest(new int[] {1, 2, 3, 7}, 8); // locks [1, 2, 3] (incLockRef)
            eq(3, pool.matchedPrefixLen(id), "matched");
            sizes(pool.radixCache(), 6, 3, 3);
            int evicted = pool.evict(6);
            eq(3, evicted, "only the unlocked leaf is evicted");
            sizes(pool.radixCache(), 3, 0, 3);
            pool.unbindRequest(id); // decLockRef
            sizes(pool.radixCache(), 3, 3, 0);
            int[] m = match(pool, 1, 2, 3);
            eq(3, m.length, "the locked node survived eviction");
        }
    }

    @Scenario
    public static void evictWhenLeavesUnlockedThenPagesFreedAndSizeDecreases(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            insert(pool, 1, 2, 3);
            insert(pool, 4, 5, 6);
            eq(6, pool.radixCache().evictableSize(), "evictableSize");
            int free = pool.freePages();
            int evicted = pool.evict(3);
            check(evicted >= 3, "evicted at least 3, got " + evicted);
            check(pool.radixCache().evictableSize() < 6, "evictableSize decreased");
            eq(free + evicted, pool.freePages(), "evicted pages return to the free list");
            eq(evicted, pool.prefixEvictTokens(), "prefixEvictTokens");
            pool.evict(1000); // "reset": everything unlocked goes
            sizes(pool.radixCache(), 0, 0, 0);
            eq(64, pool.freePages(), "all free");
        }
    }

    @Scenario
    public static void pageSizeOfTwoWhenInsertOddLengthSequenceThenTailIsDropped(List<String> log) {
        try (KvCachePool pool = pool(2)) {
            eq(2, pool.radixCache().pageSize(), "pageSize");
            int[] slots = insert(pool, 1, 2, 3, 4, 5);
            eq(4, pool.radixCache().totalSize(), "totalSize");
            eq(head(slots, 4), match(pool, 1, 2, 3, 4, 5), "match");
        }
    }

    @Scenario
    public static void pageSizeOfTwoWhenMatchSharedPrefixThenResultIsPageAligned(List<String> log) {
        try (KvCachePool pool = pool(2)) {
            int[] slots = insert(pool, 1, 2, 3, 4, 5, 6);
            eq(head(slots, 2), match(pool, 1, 2, 3, 9), "match");
        }
    }

    @Scenario
    public static void matchPartialThenNodeIsSplitAndRematchedStably(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            insert(pool, 1, 2, 3, 4, 5);
            int[] m1 = match(pool, 1, 2, 3, 9, 9);
            int[] m2 = match(pool, 1, 2, 3, 9, 9);
            eq(3, m1.length, "first match");
            eq(m1, m2, "same indices");
            sizes(pool.radixCache(), 5, 5, 0);
        }
    }

    @Scenario
    public static void matchEmptyKeyThenReturnsEmpty(List<String> log) {
        try (KvCachePool pool = pool(1)) {
            insert(pool, 1, 2, 3);
            eq(new int[0], match(pool), "match");
            Check.expect(IllegalArgumentException.class, "null", () -> pool.radix().matchPrefix(null));
        }
    }
}
