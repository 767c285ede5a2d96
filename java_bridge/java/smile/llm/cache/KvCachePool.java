package smile.llm.cache;

import java.nio.ByteBuffer;
import smile.deep.tensor.Device;
import smile.deep.tensor.ScalarType;
import smile.llm.python.Bridge;

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
 * <p>Bulk K/V crosses as direct {@link ByteBuffer}s in native byte order, viewed by Python without copies. Every
 * buffer argument is used from its {@code position()} to its {@code limit()}, like an absolute bulk method: the
 * call never moves the buffer's position or limit. {@code remaining()} must hold the values (more is fine);
 * {@link IllegalArgumentException} names the argument and the sizes otherwise, and also refuses a heap buffer, a
 * buffer not in native byte order (note that {@code slice()}, {@code duplicate()} and {@code asReadOnlyBuffer()}
 * return big-endian buffers: call {@code order(ByteOrder.nativeOrder())} on them), and a read-only buffer given
 * for output ({@code get}, {@code getPadded}). A read-only buffer is fine as input ({@code put}); it is read in
 * place, not copied.
 *
 * <p>Smile source compatibility: the static factories ({@link #forTesting(KvCacheLayout, Device)},
 * {@link #allocate(KvCacheLayout, Device, ScalarType, double, int)}, {@link #forMtp}, {@link #forMtpHistory}),
 * {@link #DEFAULT_PAGE_SIZE}, {@link #radix()}, the scalar forms of the step verbs (a scalar means the same value for
 * every active row) and {@code clearStepFlashInferMetadata()} have Smile's names and signatures. Smile's
 * {@code Tensor} arguments and results cross as {@code ByteBuffer}s ({@code put}, {@code get}, {@code getPadded})
 * or Java arrays (slot ids, FlashInfer CSR); Smile's {@code new KvCachePool(...)} is
 * {@link Bridge#newKvCachePool}.
 */
public interface KvCachePool extends AutoCloseable {
    /** Smile's default page size, tokens per page (Python's {@code KvCachePool.DEFAULT_PAGE_SIZE} is the same). */
    int DEFAULT_PAGE_SIZE = 16;

    // ------------------------------------------------------------------ factories (through the launcher's Bridge)
    /** {@link #forTesting(KvCacheLayout, Device)} on the CPU. */
    static KvCachePool forTesting(KvCacheLayout layout) {
        return Bridge.forTesting(layout);
    }

    /** A test pool: page size 1, float32, {@code maxBatchSize * maxSeqLen} slots on {@code device}. */
    static KvCachePool forTesting(KvCacheLayout layout, Device device) {
        return Bridge.forTesting(layout, device);
    }

    /** {@link #allocate(KvCacheLayout, Device, ScalarType, double, int)} with {@link #DEFAULT_PAGE_SIZE}. */
    static KvCachePool allocate(KvCacheLayout layout, Device device, ScalarType dtype, double memFraction) {
        return allocate(layout, device, dtype, memFraction, DEFAULT_PAGE_SIZE);
    }

    /**
     * A pool for {@code layout} sized by SGLang's mem-fraction-static rule on CUDA (call it after the weights are
     * loaded), else {@code maxBatchSize * maxSeqLen} slots rounded down to whole pages (at least one page).
     *
     * @throws IllegalArgumentException for {@code memFraction} outside (0, 1], {@code pageSize < 1} or a dtype the
     *         pool cannot store; {@link IllegalStateException} when not one page fits on the device.
     */
    static KvCachePool allocate(KvCacheLayout layout, Device device, ScalarType dtype, double memFraction,
                                int pageSize) {
        return Bridge.allocate(layout, device, dtype, memFraction, pageSize);
    }

    /** The per-round MTP draft pool: {@code maxBatchSize * ceil(maxSeqLen / pageSize) * pageSize} slots. */
    static KvCachePool forMtp(KvCacheLayout layout, Device device, ScalarType dtype, int pageSize) {
        return Bridge.forMtp(layout, device, dtype, pageSize);
    }

    /**
     * The persistent MTP history pool: {@code wantSlots} rounded down to whole pages (on CUDA at most half the free
     * memory), prefix reuse off.
     *
     * @throws IllegalStateException if not one page fits.
     */
    static KvCachePool forMtpHistory(KvCacheLayout layout, Device device, ScalarType dtype, int pageSize,
                                     int wantSlots) {
        return Bridge.forMtpHistory(layout, device, dtype, pageSize, wantSlots);
    }

    // ------------------------------------------------------------------ geometry and counters
    int numLayers();
    int numSlots();
    int numKvHeads();
    int headDim();
    int pageSize();
    /** The storage dtype, as torch names it (for example "torch.float32"). */
    String dtype();
    /** The dtype {@code get} returns and {@code put} takes (the storage dtype, except for FP8 storage). */
    ScalarType computeDtype();
    /** True when K/V are stored in {@link #computeDtype()} (not FP8). */
    boolean kvIsComputeDtype();
    /** The FP8 K scale (1.0 for float storage). */
    float kScale();
    /** The FP8 V scale (1.0 for float storage). */
    float vScale();
    /** The device the K/V live on. */
    Device device();
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
    /**
     * The pool's prefix tree (Smile's name; the same object every call): queries and {@code matchPrefix} work,
     * mutations throw {@link IllegalStateException} (see {@link RadixCache}).
     */
    RadixCache radix();
    /** The same tree as {@link #radix()}. */
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
    /** Read positions {@code [0, length)} of every active row into {@code k} and {@code v} (compute dtype). */
    void get(int layer, int length, ByteBuffer k, ByteBuffer v);
    /**
     * Like {@link #get} for rows of different capacity: {@code length} may reach the largest active capacity, and a
     * row's positions past its own capacity read its last slot again (mask them).
     */
    void getPadded(int layer, int length, ByteBuffer k, ByteBuffer v);
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
    /** Physical slot ids of positions {@code [startPos[b], startPos[b] + seqlen)} of every active row, row-major. */
    long[] slotIndices(int[] startPos, int seqlen);
    /** Caller-owned, page-aligned slots (evicting from the tree if needed). */
    long[] alloc(int numTokens);
    void free(long[] slots);
    int evict(int numTokens);

    // ------------------------------------------------------------------ FlashInfer metadata, seal and truncate
    // (each verb below takes one value per active row, or a scalar for every row: the two forms are the same call)
    /** The step CSR for the active rows at {@code lengths}: {indptr, indices, lastPageLen}. */
    int[][] sharedFlashInferMetadata(int[] lengths);
    /** The step CSR with every active row at {@code length}. */
    int[][] sharedFlashInferMetadata(int length);
    /** A caller-owned CSR for the active rows at {@code lengths}: {indptr, indices, lastPageLen}. */
    int[][] buildFlashInferMetadata(int[] lengths);
    /** A caller-owned CSR with every active row at {@code length}. */
    int[][] buildFlashInferMetadata(int length);
    /** Forget the step CSR (the next {@code sharedFlashInferMetadata} rebuilds it). */
    void clearStepMetadata();
    /** Smile's name of {@link #clearStepMetadata()}. */
    void clearStepFlashInferMetadata();
    /** Attention sees only {@code [0, sealedLen)}; true when the step CSR kept its tensors. */
    boolean sealLength(int[] sealedLen);
    boolean sealLength(int sealedLen);
    /** After a verify window wrote up to {@code writtenEnd}, seal to {@code sealedLen}. */
    boolean truncateTo(int[] sealedLen, int[] writtenEnd);
    boolean truncateTo(int sealedLen, int writtenEnd);
    /** Zero K and V of {@code [fromPos, endPos)} on every layer; {@code kvLen} drops to at most {@code fromPos}. */
    void invalidateRange(int[] fromPos, int[] endPos);
    void invalidateRange(int fromPos, int endPos);

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
