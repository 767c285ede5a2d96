package smile.llm.cache;

import smile.deep.tensor.Tensor;

/**
 * What {@link RadixCache#matchPrefix} returns, as Smile's {@code MatchResult}: the slot ids as a one-dimensional
 * int64 host {@link Tensor} (the bridge's host-array subset of Smile's tensor).
 *
 * @param indices the KV slot ids of the longest cached prefix, concatenated (a multiple of the page size; empty on a
 *                miss); {@code indices().longArray()} gives them as a Java array.
 * @param lastNode the deepest node reached (the root on a miss): what a caller passes to
 *                 {@link RadixCache#incLockRef} while it uses the prefix and to {@link RadixCache#decLockRef} after.
 */
public record MatchResult(Tensor indices, RadixTreeNode lastNode) implements AutoCloseable {
    /** @throws IllegalArgumentException for null indices or node. */
    public MatchResult {
        if (indices == null || lastNode == null) {
            throw new IllegalArgumentException("MatchResult needs indices and a lastNode");
        }
    }

    /** Matched tokens: the length of {@code indices()}. */
    public int length() {
        return (int) indices.length();
    }

    /**
     * Does nothing: the indices are a host copy the garbage collector frees (Smile's close frees a native tensor). So
     * Smile's {@code try (var m = cache.matchPrefix(tokens)) { ... }} compiles; it never unlocks or evicts anything.
     */
    @Override
    public void close() {}
}
