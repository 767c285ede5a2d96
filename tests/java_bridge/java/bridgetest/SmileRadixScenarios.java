package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.ArrayList;
import java.util.List;
import smile.llm.cache.InsertResult;
import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;
import smile.llm.cache.MatchResult;
import smile.llm.cache.RadixCache;
import smile.llm.cache.RadixTreeNode;
import smile.llm.python.Bridge;

/**
 * Smile's {@code RadixCache} semantics on a standalone tree ({@code new RadixCache(pageSize)}, backed by the Python
 * tree): match splits, insert's prefixLen, LRU eviction with cascade (the evicted slot ids come back, the tree
 * frees nothing), lock references, reset, namespaces and stale or foreign node handles; and a pool's own tree,
 * which matches but refuses every mutation with IllegalStateException, leaving the pool unchanged.
 */
public final class SmileRadixScenarios {
    private SmileRadixScenarios() {}

    static void sizes(RadixCache tree, int total, int evictable, int locked) {
        eq(total, tree.totalSize(), "totalSize");
        eq(evictable, tree.evictableSize(), "evictableSize");
        eq(locked, tree.protectedSize(), "protectedSize");
    }

    @Scenario
    public static void matchWhenEndsInsideEdgeThenSplitAndLockProtectsPrefix(List<String> log) {
        RadixCache tree = new RadixCache(1);
        InsertResult r = tree.insert(new int[] {1, 2, 3, 4, 5}, new long[] {10, 11, 12, 13, 14});
        eq(0, r.prefixLen(), "nothing cached before");
        MatchResult m = tree.matchPrefix(new int[] {1, 2, 3, 9, 9});
        eq(new long[] {10, 11, 12}, m.indices().longArray(), "match");
        eq(3, m.length(), "length()");
        check(m.lastNode().id != r.lastNode().id, "the match ends on the new prefix node of the split");
        sizes(tree, 5, 5, 0);
        InsertResult r2 = tree.insert(new int[] {1, 2, 3, 7}, new long[] {20, 21, 22, 23});
        eq(3, r2.prefixLen(), "[1, 2, 3] was cached: slots 20-22 are the caller's duplicates");
        eq(new long[] {10, 11, 12, 23}, tree.matchPrefix(new int[] {1, 2, 3, 7}).indices().longArray(), "match of the branch");
        eq(-3, tree.incLockRef(m.lastNode()), "locking [1, 2, 3]");
        sizes(tree, 6, 3, 3);
        eq(new long[] {13, 14, 23}, tree.evict(100), "LRU: [4, 5] then [7]; the locked prefix stays");
        sizes(tree, 3, 0, 3);
        eq(3, tree.decLockRef(m.lastNode()), "unlocking");
        log.add(expect(IllegalStateException.class, "not locked", () -> tree.decLockRef(m.lastNode())).getMessage());
        sizes(tree, 3, 3, 0);
        eq(new long[] {10, 11, 12}, tree.evict(1), "whole nodes: more than asked");
        sizes(tree, 0, 0, 0);
    }

    @Scenario
    public static void evictWhenLeavesUnlockedThenLruOrderAndCascade(List<String> log) {
        RadixCache tree = new RadixCache();
        eq(1, tree.pageSize(), "default page size");
        tree.insert(new int[] {1, 2, 3}, new long[] {10, 11, 12});
        eq(2, tree.insert(new int[] {1, 2, 4}, new long[] {20, 21, 22}).prefixLen(), "prefixLen");
        tree.insert(new int[] {7, 8}, new long[] {30, 31});
        tree.matchPrefix(new int[] {1, 2, 3}); // [3] becomes the most recent leaf
        eq(new long[] {22}, tree.evict(1), "the least recent leaf [4]");
        eq(new long[] {30, 31}, tree.evict(1), "then [7, 8]");
        List<long[]> freed = new ArrayList<>();
        eq(3, tree.evict(2, slots -> freed.add(slots.longArray())),
                "[3], then its parent [1, 2] once it is an unlocked leaf");
        eq(1, freed.size(), "the callback runs once per call");
        eq(new long[] {12, 10, 11}, freed.get(0), "every evicted slot, in eviction order");
        eq(0, tree.evict(5, slots -> freed.add(slots.longArray())), "nothing left");
        eq(1, freed.size(), "no callback when nothing was evicted");
        eq(0, tree.evict(5, null), "a null callback");
        sizes(tree, 0, 0, 0);
        expect(IllegalArgumentException.class, "evict needs a token count >= 0", () -> tree.evict(-1));
    }

    @Scenario
    public static void handlesWhenEvictedResetOrForeignThenIllegalArgument(List<String> log) {
        RadixCache tree = new RadixCache(2);
        eq(2, tree.pageSize(), "pageSize");
        RadixTreeNode leaf = tree.insert(new int[] {1, 2, 3, 4, 5}, new long[] {10, 11, 12, 13, 14}).lastNode();
        eq(4, tree.totalSize(), "the odd tail is dropped");
        MatchResult miss = tree.matchPrefix(new int[] {9, 9});
        eq(0, miss.length(), "miss");
        eq(0, tree.incLockRef(miss.lastNode()), "locking the root changes nothing");
        eq(0, tree.decLockRef(miss.lastNode()), "nor unlocking it");
        eq(0, tree.incLockRef(null), "null");
        eq(0, tree.matchPrefix(new int[] {1}).length(), "less than a page");
        check(!leaf.isEvicted(), "live");
        eq(new long[] {10, 11, 12, 13}, tree.evict(1), "evict");
        check(leaf.isEvicted(), "evicted");
        log.add(expect(IllegalArgumentException.class, "evicted", () -> tree.incLockRef(leaf)).getMessage());
        RadixCache other = new RadixCache(2);
        RadixTreeNode foreign = other.insert(new int[] {1, 2}, new long[] {5, 6}).lastNode();
        log.add(expect(IllegalArgumentException.class, "not a node of this RadixCache",
                () -> tree.incLockRef(foreign)).getMessage());
        eq(0, tree.totalSize(), "a refused lock changes nothing");
        RadixTreeNode n = tree.insert(new int[] {1, 2}, new long[] {7, 8}).lastNode();
        tree.reset();
        sizes(tree, 0, 0, 0);
        check(n.isEvicted(), "reset drops every node");
        expect(IllegalArgumentException.class, "not a node of this RadixCache", () -> tree.incLockRef(n));
        expect(IllegalArgumentException.class, "not a node of this RadixCache",
                () -> tree.decLockRef(miss.lastNode()));
        eq(2, other.totalSize(), "the other tree is untouched");
        expect(IllegalArgumentException.class, "kv_indices", () -> tree.insert(new int[] {1, 2}, new long[] {1}));
        expect(IllegalArgumentException.class, "must not be null", () -> tree.insert(null, new long[] {1}));
        expect(IllegalArgumentException.class, "must not be null", () -> tree.matchPrefix(null));
        expect(IllegalArgumentException.class, "pageSize must be >= 1", () -> new RadixCache(0));
    }

    @Scenario
    public static void namespacesWhenExtraKeyThenDisjointAndCloseHarmless(List<String> log) {
        RadixCache tree = new RadixCache();
        eq(0, tree.insert(new int[] {1, 2, 3}, new long[] {10, 11, 12}, "lora-a", 5).prefixLen(), "insert");
        eq(0, tree.matchPrefix(new int[] {1, 2, 3}).length(), "the default namespace does not see lora-a");
        eq(0, tree.matchPrefix(new int[] {1, 2, 3}, "lora-b").length(), "nor does lora-b");
        eq(0, tree.insert(new int[] {1, 2, 3}, new long[] {20, 21, 22}).prefixLen(), "the same tokens, default");
        eq(6, tree.totalSize(), "two disjoint paths");
        try (MatchResult m = tree.matchPrefix(new int[] {1, 2, 3}, new String("lora-a"))) {
            eq(new long[] {10, 11, 12}, m.indices().longArray(), "namespaces compare by value");
        }
        MatchResult m = tree.matchPrefix(new int[] {1, 2, 3});
        m.close();
        eq(new long[] {20, 21, 22}, m.indices().longArray(), "close() leaves the indices");
        eq(-3, tree.incLockRef(m.lastNode()), "and the node usable");
        sizes(tree, 6, 3, 3);
    }

    @Scenario
    public static void poolTreeWhenMutatedThenIllegalStateAndPoolUnchanged(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, 1, 4, 1)) {
            RadixScenarios.insert(pool, 1, 2, 3);
            int id = pool.bindRequest(new int[] {1, 2, 3, 4}, 8); // locks the cached [1, 2, 3]
            RadixCache tree = pool.radix();
            MatchResult m = tree.matchPrefix(new int[] {1, 2, 9}); // splits the locked node
            eq(2, m.length(), "a pool's tree matches");
            pool.checkInvariants();
            String stats = pool.statsJson();
            List<Check.Call> mutations = List.of(
                    () -> tree.insert(new int[] {9, 9}, new long[] {0, 1}),
                    () -> tree.insert(new int[] {9, 9}, new long[] {0, 1}, "ns", 1),
                    () -> tree.evict(3),
                    () -> tree.evict(3, slots -> {}),
                    () -> tree.incLockRef(m.lastNode()),
                    () -> tree.decLockRef(m.lastNode()),
                    tree::reset);
            for (Check.Call call : mutations) {
                log.add(expect(IllegalStateException.class, "use the pool's methods", call).getMessage());
            }
            eq(stats, pool.statsJson(), "statsJson unchanged");
            pool.checkInvariants();
            sizes(tree, 3, 0, 3);
            check(!m.lastNode().isEvicted(), "the matched node lives");
            pool.unbindRequest(id);
            eq(3, pool.evict(3), "evicted through the pool");
            check(m.lastNode().isEvicted(), "the handle sees it");
        }
        KvCachePool pool = Bridge.forTesting(new KvCacheLayout(1, 1, 4, 1, 8)); // not audited: closed below
        RadixCache tree = pool.radix();
        pool.close();
        expect(IllegalStateException.class, "closed", tree::totalSize);
        expect(IllegalStateException.class, "closed", () -> tree.matchPrefix(new int[] {1}));
        expect(IllegalStateException.class, "closed", pool::radix);
    }
}
