package smile.llm.cache;

/**
 * The pool's prefix tree, for inspection: token sequences to the KV slots that hold them. Mutate the tree only
 * through the {@link KvCachePool} (evicting from it directly would leak pages).
 */
public interface RadixCache {
    /** The longest cached prefix of {@code tokenIds}: the slot ids of its tokens (page aligned). */
    int[] matchPrefix(int[] tokenIds);

    /** Tokens held by the tree. */
    int totalSize();

    /** Tokens held by unlocked nodes (what eviction can reclaim). */
    int evictableSize();

    /** Tokens held by nodes a bound request has locked. */
    int protectedSize();

    /** The page size (a match or insert covers whole pages). */
    int pageSize();
}
