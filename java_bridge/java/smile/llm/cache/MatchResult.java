package smile.llm.cache;

/**
 * What {@link RadixCache#matchPrefix} returns, as Smile's {@code MatchResult} with the slot ids as a Java array
 * instead of an int64 tensor.
 *
 * @param indices the KV slot ids of the longest cached prefix, concatenated (a multiple of the page size; empty on a
 *                miss). The caller owns this array.
 * @param lastNode the deepest node reached (the root on a miss): what a caller passes to
 *                 {@link RadixCache#incLockRef} while it uses the prefix and to {@link RadixCache#decLockRef} after.
 */
public record MatchResult(long[] indices, RadixTreeNode lastNode) implements AutoCloseable {
    /** @throws IllegalArgumentException for null indices or node. */
    public MatchResult {
        if (indices == null || lastNode == null) {
            throw new IllegalArgumentException("MatchResult needs indices and a lastNode");
        }
    }

    /** Matched tokens: {@code indices().length}. */
    public int length() {
        return indices.length;
    }

    /**
     * Does nothing: the indices are a Java array the garbage collector frees (Smile's close frees a tensor). Kept so
     * Smile's {@code try (var m = cache.matchPrefix(tokens)) { ... }} compiles; it never unlocks or evicts anything.
     */
    @Override
    public void close() {}
}
