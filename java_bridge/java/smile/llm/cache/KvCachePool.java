package smile.llm.cache;

import java.nio.ByteBuffer;

/**
 * Smile's paged KV-cache pool with an embedded radix prefix cache, backed by the Python {@code smile_llm}
 * implementation. Every method is atomic; the methods that act on the active step ({@code activateStep} then
 * {@code put}, {@code get}, metadata, seal) form a sequence one driver thread must own.
 *
 * <p>Errors: {@link IllegalArgumentException} for bad input, {@link KvCacheExhaustedException} when pages run
 * out, {@link IllegalStateException} for a call in the wrong state (no active step, a closed pool), and
 * {@link smile.llm.python.PythonException} for anything else, with the Python type and traceback. A failed call
 * changes nothing.
 *
 * <p>Bulk K/V crosses as direct {@link ByteBuffer}s in native byte order, viewed by Python without copies.
 */
public interface KvCachePool extends AutoCloseable {
    // ------------------------------------------------------------------ geometry and counters
    int numLayers();
    int numSlots();
    int numKvHeads();
    int headDim();
    int pageSize();
    /** The storage dtype, as torch names it (for example "torch.float32"). */
    String dtype();
    int freePages();
    int freeSlots();
    /** The smallest capacity among the active rows (0 without an active step). */
    int requestCapacity();
    int boundRequestCount();
    boolean isPrefixReuseEnabled();
    void setPrefixReuseEnabled(boolean enabled);
    long prefixPromptTokens();
    long prefixMatchTokens();
    long prefixInsertTokens();
    long prefixEvictTokens();
    RadixCache radixCache();

    // ------------------------------------------------------------------ binding
    /** Continuous-batching bind: returns the request id (positive, never reused). */
    int bindRequest(int[] promptTokens, int totalCapacity);
    /** Exclusive batch-1 bind: releases every other binding; returns the matched prefix length. */
    int bindWithPrefix(int[] promptTokens, int totalCapacity);
    /** Exclusive batch without prefix reuse; returns the ids. */
    int[] bindRequests(int batchSize, int capacity);
    /** Insert the request's written prefix into the tree, then unbind. */
    void finishRequest(int requestId, int[] sequenceTokens);
    /** With exactly one binding, finish it with {@code sequenceTokens}; otherwise release everything. */
    void finishRequest(int[] sequenceTokens);
    /** Instant eviction: free the request's private pages, insert nothing. */
    void unbindRequest(int requestId);
    void unbindRequests();
    boolean isBound(int requestId);
    int matchedPrefixLen(int requestId);
    int kvLen(int requestId);
    /** The batch (in order) that put/get/metadata/seal act on. */
    void activateStep(int... requestIds);
    int[] activeRequestIds();
    void ensureRequest(int batchSize, int endPos);

    // ------------------------------------------------------------------ K/V (native-order direct buffers)
    /**
     * Write positions {@code [startPos, startPos + seqLen)} of every active row of {@code layer}: {@code k} and
     * {@code v} hold {@code [B, seqLen, numKvHeads, headDim]} values of the pool's dtype.
     */
    void put(int layer, int startPos, int seqLen, ByteBuffer k, ByteBuffer v);
    /** Like {@link #put(int, int, int, ByteBuffer, ByteBuffer)} with one start position per active row. */
    void put(int layer, int[] startPositions, int seqLen, ByteBuffer k, ByteBuffer v);
    /** Read positions {@code [0, length)} of every active row into {@code k} and {@code v} (pool dtype). */
    void get(int layer, int length, ByteBuffer k, ByteBuffer v);
    /**
     * The pool's own K buffer of {@code layer}, {@code [numSlots, numKvHeads, headDim]} values of the storage dtype
     * in native byte order, shared without a copy (writes are seen by both sides). CPU pools only: on a GPU the
     * KV stays in Python ({@link IllegalStateException}). The buffer stays valid after {@link #close()}.
     */
    ByteBuffer keyLayer(int layer);
    /** The V buffer of {@code layer}; see {@link #keyLayer(int)}. */
    ByteBuffer valueLayer(int layer);
    /** Physical slot ids of positions {@code [0, length)} of every active row, row-major. */
    long[] slotIndices(int length);
    /** Caller-owned, page-aligned slots (evicting from the tree if needed). */
    long[] alloc(int numTokens);
    void free(long[] slots);
    int evict(int numTokens);

    // ------------------------------------------------------------------ FlashInfer metadata, seal and truncate
    /** The step CSR for the active rows at {@code lengths}: {indptr, indices, lastPageLen}. */
    int[][] sharedFlashInferMetadata(int[] lengths);
    /** A caller-owned CSR for the active rows at {@code lengths}: {indptr, indices, lastPageLen}. */
    int[][] buildFlashInferMetadata(int[] lengths);
    void clearStepMetadata();
    boolean sealLength(int[] sealedLen);
    boolean truncateTo(int[] sealedLen, int[] writtenEnd);
    void invalidateRange(int[] fromPos, int[] endPos);

    // ------------------------------------------------------------------ page buckets
    int numPagesForLength(int length);
    int stepsUntilPageBoundary(int cacheLen);
    int firstCacheLenInNextPageBucket(int numPages);

    // ------------------------------------------------------------------ audit
    /** Throws {@link IllegalStateException} naming the first broken page if the pool's bookkeeping is corrupt. */
    void checkInvariants();
    /** Counters and page ownership, as a JSON object. */
    String statsJson();

    @Override
    void close();
}
