package smile.llm.cache;

import java.nio.ByteBuffer;
import smile.deep.tensor.Device;
import smile.deep.tensor.ScalarType;
import smile.deep.tensor.Tensor;
import smile.llm.python.Bridge;

/**
 * Smile's paged KV-cache pool with an embedded radix prefix cache: a class with Smile's constructor, static
 * factories and members, whose pages, K/V buffers and bookkeeping live in the Python
 * {@code smile_llm.cache.KvCachePool} it delegates to (through a {@link Backend}, as {@link RadixCache} does).
 * The pool is static: binds claim free pages (evicting unlocked prefixes from the tree when needed) and never grow
 * the buffers.
 *
 * <p>Every method is atomic and thread-safe; the calls that act on the active step ({@link #activateStep} then
 * {@code put}, {@code get}, the metadata, seal and graph calls) form a sequence that one driver thread must own.
 * Errors: {@link IllegalArgumentException} for bad input, {@link KvCacheExhaustedException} when pages run out,
 * {@link IllegalStateException} for a call in the wrong state (no active step, a closed pool, a graph buffer that
 * was not prepared) and {@link smile.llm.python.PythonException} for anything else, with the Python type and
 * traceback. A call that throws changes nothing.
 *
 * <p><b>K/V crosses as direct {@link ByteBuffer}s.</b> Smile's {@code put(int, int, Tensor, Tensor)},
 * {@code put(int, int[], Tensor, Tensor)} and {@code get(int, int)} move LibTorch device tensors; the bridge's
 * {@link Tensor} is a host array, so those forms are out of scope. Here K/V are direct buffers in native byte
 * order, viewed by Python without a copy: every buffer is used from its {@code position()} like an absolute bulk
 * method (position and limit are left as they are), {@code remaining()} must hold the values, and
 * {@link IllegalArgumentException} names the argument otherwise. A heap buffer, a buffer in another byte order
 * ({@code slice()}, {@code duplicate()} and {@code asReadOnlyBuffer()} return big-endian buffers: call
 * {@code order(ByteOrder.nativeOrder())}) and a read-only buffer given for output are refused too; a read-only
 * buffer is fine as input.
 *
 * <p><b>FlashInfer CSR.</b> The metadata calls return {@link FlashInferKvMetadata} with host {@code Int32}
 * tensors. The step CSR ({@link #sharedFlashInferMetadata(int[])}) is the same object for as long as the pool
 * keeps it: while the step's lengths are unchanged, and while every row keeps its page count (the pool then only
 * rewrites {@code lastPageLen} in place, also through {@link #sealLength} and {@link #truncateTo}). A page
 * boundary crossed or a new cohort of rows rebuilds it: a new object. {@link #buildFlashInferMetadata(int[])}
 * returns a new, fixed CSR every call.
 *
 * <p><b>Prefix matches</b> stop below the prompt's last token ({@code floor_page(promptLength - 1)} tokens at
 * most), because the model needs that token's logits: a repeated prompt of 8 tokens at page size 1 matches 7,
 * where Smile matches 8.
 */
public class KvCachePool implements AutoCloseable {
    /** Smile's default page size, tokens per page (Python's {@code KvCachePool.DEFAULT_PAGE_SIZE} is the same). */
    public static final int DEFAULT_PAGE_SIZE = 16;

    /**
     * The budget of SGLang's mem-fraction-static rule, as {@link #computeStaticKvBudget} computes it.
     *
     * @param total the device's total memory, bytes.
     * @param used the bytes already in use ({@code total - free}: weights and other static buffers).
     * @param staticBudget {@code floor(total * memFraction)}: weights, static pools and the KV.
     * @param kvBudget the bytes left for the KV: {@code staticBudget - used - softMargin}, or without the soft margin
     *                 when that leaves less than one page.
     * @param dynamicReserve {@code total - staticBudget}, left free for activations.
     * @param numSlots the page-aligned slots the budget buys, capped at {@code maxUsefulSlots}.
     * @param maxUsefulSlots {@code maxBatchSize * maxSeqLen} rounded up to whole pages.
     */
    public record StaticKvBudget(long total, long used, long staticBudget, long kvBudget, long dynamicReserve,
                                 int numSlots, int maxUsefulSlots) {}

    /**
     * What a Python pool implements for this class: the bridge's side, not for applications. Each method is the
     * class method of the same name (an {@code int} argument where the class takes one value per row means that
     * value for every active row); see the class for their contracts.
     */
    public interface Backend {
        // geometry and counters
        int numLayers();
        int numSlots();
        int numKvHeads();
        int headDim();
        int pageSize();
        String dtype();
        String dtypeForLayer(int layer);
        long kBlockStrideBytesForLayer(int layer);
        long vBlockStrideBytesForLayer(int layer);
        ScalarType computeDtype();
        boolean kvIsComputeDtype();
        float kScale();
        float vScale();
        Device device();
        int freePages();
        int freeSlots();
        int requestCapacity();
        int boundRequestCount();
        boolean isPrefixReuseEnabled();
        void setPrefixReuseEnabled(boolean enabled);
        long prefixPromptTokens();
        long prefixMatchTokens();
        long prefixInsertTokens();
        long prefixEvictTokens();
        RadixCache radix();
        RadixCache radixCache();

        // binding
        int bindRequest(int[] promptTokens, int totalCapacity);
        int bindWithPrefix(int[] promptTokens, int totalCapacity);
        int[] bindRequests(int batchSize, int capacity);
        void finishRequest(int requestId, int[] sequenceTokens);
        void finishRequest(int[] sequenceTokens);
        void unbindRequest(int requestId);
        void unbindRequests();
        boolean isBound(int requestId);
        int matchedPrefixLen(int requestId);
        int kvLen(int requestId);
        void activateStep(int... requestIds);
        int[] activeRequestIds();
        void ensureRequest(int batchSize, int endPos);

        // K/V
        void put(int layer, int startPos, int seqLen, ByteBuffer k, ByteBuffer v);
        void put(int layer, int[] startPositions, int seqLen, ByteBuffer k, ByteBuffer v);
        void get(int layer, int length, ByteBuffer k, ByteBuffer v);
        void getPadded(int layer, int length, ByteBuffer k, ByteBuffer v);
        ByteBuffer keyLayer(int layer);
        ByteBuffer valueLayer(int layer);
        long[] slotIndices(int length);
        long[] slotIndices(int[] startPos, int seqlen);
        long[] alloc(int numTokens);
        void free(long[] slots);
        int evict(int numTokens);

        // FlashInfer CSR, seal and truncate
        FlashInferKvMetadata sharedFlashInferMetadata(int[] lengths);
        FlashInferKvMetadata sharedFlashInferMetadata(int length);
        FlashInferKvMetadata buildFlashInferMetadata(int[] lengths);
        FlashInferKvMetadata buildFlashInferMetadata(int length);
        FlashInferKvMetadata currentStepFlashInferMetadata();
        void clearStepMetadata();
        void clearStepFlashInferMetadata();
        boolean sealLength(int[] sealedLen);
        boolean sealLength(int sealedLen);
        boolean truncateTo(int[] sealedLen, int[] writtenEnd);
        boolean truncateTo(int sealedLen, int writtenEnd);
        boolean truncateTo(int[] sealedLen, int[] writtenEnd, boolean zeroRejected);
        boolean truncateTo(int sealedLen, int writtenEnd, boolean zeroRejected);
        boolean zeroRejectedKv();
        void setZeroRejectedKv(boolean on);
        void invalidateRange(int[] fromPos, int[] endPos);
        void invalidateRange(int fromPos, int endPos);

        // page buckets
        int numPagesForLength(int length);
        int stepsUntilPageBoundary(int cacheLen);
        int firstCacheLenInNextPageBucket(int numPages);

        // CUDA-graph fixed buffers and decode prefetch
        boolean decodeGraphBuffers();
        void setDecodeGraphBuffers(boolean on);
        boolean verifyGraphBuffers();
        void setVerifyGraphBuffers(boolean on);
        boolean verifyWindowKernel();
        void setVerifyWindowKernel(boolean on);
        FlashInferKvMetadata prepareDecodeGraphStep(int cacheLen, int[] positions);
        FlashInferKvMetadata prepareDecodeGraphStep(int[] cacheLens, int[] positions);
        void reserveGraphRows(int rows);
        FlashInferKvMetadata decodeGraphMetadata(int batch);
        Tensor decodeGraphIndex(int batch);
        FlashInferKvMetadata beginPrefetchDecodeGraphStep(int cacheLen, int cachePos, int batch);
        FlashInferKvMetadata endPrefetchDecodeGraphStep();
        /** {@code source} is {@code meta}'s own for a pool-owned CSR, null for a fixed one. */
        void installPrefetchedStepMetadata(FlashInferKvMetadata.Source source, FlashInferKvMetadata meta,
                                           int uniformLen);
        FlashInferKvMetadata prepareVerifyGraphStep(int cacheLen, int[] startPositions, int windowLen);
        FlashInferKvMetadata prepareVerifyGraphStep(int[] cacheLens, int[] startPositions, int windowLen);
        FlashInferKvMetadata prepareVerifyStep(int cacheLen, int[] startPositions, int windowLen);
        FlashInferKvMetadata prepareVerifyStep(int[] cacheLens, int[] startPositions, int windowLen);
        Tensor verifyGraphIndex(int batch, int windowLen);
        FlashInferKvMetadata verifyGraphMetadata();
        boolean consumeVerifyGraphMetaRealloc();
        Tensor verifyQoIndptrBuf(int batch, int windowLen);

        // audit and lifetime
        void checkInvariants();
        String statsJson();
        void close();
    }

    private final Backend backend;

    /**
     * Smile's constructor: a new pool of {@code numSlots} slots in pages of {@code pageSize} tokens, its K and V
     * buffers {@code [numLayers, numSlots, numKvHeads, headDim]} of {@code dtype} on {@code device}, created in
     * Python through the launcher's factory (so the application must run under {@code python -m java_bridge}) and
     * closed when the launcher exits if the application did not close it.
     *
     * @throws IllegalArgumentException for a count below 1, {@code numSlots} not a multiple of {@code pageSize}, a
     *         null or unavailable device, or a dtype the pool cannot store (the integer and {@code fnuz} FP8 types).
     *         Unlike Smile, FP8 storage works on every device.
     * @throws IllegalStateException if the application does not run under the launcher.
     */
    public KvCachePool(int numLayers, int numSlots, int numKvHeads, int headDim, int pageSize, Device device,
                       ScalarType dtype) {
        this(Bridge.kvCachePoolBackend(numLayers, numSlots, numKvHeads, headDim, pageSize, device, dtype));
    }

    /**
     * A pool over {@code backend}; used by the bridge (and by wrappers of a backend), not by applications.
     *
     * @throws IllegalArgumentException for a null backend.
     */
    public KvCachePool(Backend backend) {
        if (backend == null) throw new IllegalArgumentException("backend must not be null");
        this.backend = backend;
    }

    // ------------------------------------------------------------------ static factories (through the Bridge)

    /** {@link #forTesting(KvCacheLayout, Device)} on the CPU. */
    public static KvCachePool forTesting(KvCacheLayout layout) {
        return Bridge.forTesting(layout);
    }

    /** A test pool: page size 1, float32, {@code maxBatchSize * maxSeqLen} slots on {@code device}. */
    public static KvCachePool forTesting(KvCacheLayout layout, Device device) {
        return Bridge.forTesting(layout, device);
    }

    /** {@link #allocate(KvCacheLayout, Device, ScalarType, double, int)} with {@link #DEFAULT_PAGE_SIZE}. */
    public static KvCachePool allocate(KvCacheLayout layout, Device device, ScalarType dtype, double memFraction) {
        return allocate(layout, device, dtype, memFraction, DEFAULT_PAGE_SIZE);
    }

    /**
     * A pool for {@code layout} sized by SGLang's mem-fraction-static rule on CUDA ({@link #computeStaticKvBudget}
     * over the device's memory; call it after the weights are loaded), else {@code maxBatchSize * maxSeqLen} slots
     * rounded down to whole pages (at least one page).
     *
     * @throws IllegalArgumentException for {@code memFraction} outside (0, 1], {@code pageSize < 1} or a dtype the
     *         pool cannot store; {@link IllegalStateException} when not one page fits on the device.
     */
    public static KvCachePool allocate(KvCacheLayout layout, Device device, ScalarType dtype, double memFraction,
                                       int pageSize) {
        return Bridge.allocate(layout, device, dtype, memFraction, pageSize);
    }

    /** The per-round MTP draft pool: {@code maxBatchSize * ceil(maxSeqLen / pageSize) * pageSize} slots. */
    public static KvCachePool forMtp(KvCacheLayout layout, Device device, ScalarType dtype, int pageSize) {
        return Bridge.forMtp(layout, device, dtype, pageSize);
    }

    /**
     * The persistent MTP history pool: {@code wantSlots} rounded down to whole pages (on CUDA at most half the free
     * memory), prefix reuse off.
     *
     * @throws IllegalStateException if not one page fits.
     */
    public static KvCachePool forMtpHistory(KvCacheLayout layout, Device device, ScalarType dtype, int pageSize,
                                            int wantSlots) {
        return Bridge.forMtpHistory(layout, device, dtype, pageSize, wantSlots);
    }

    /**
     * SGLang's mem-fraction-static rule from device memory readings (Python's {@code compute_static_kv_budget},
     * the rule {@link #allocate} applies on CUDA): {@code staticBudget = floor(total * memFraction)} holds what is
     * already {@code used = total - free} plus the KV; the KV budget keeps a soft margin of
     * {@code min(1 GiB, max(512 MiB, total / 40))}, dropped when it leaves less than one page; the slots are whole
     * pages, capped at {@code maxBatchSize * maxSeqLen} rounded up to whole pages.
     *
     * @throws IllegalArgumentException for {@code total <= 0}, {@code free} outside {@code [0, total]},
     *         {@code memFraction} outside (0, 1], or {@code bytesPerToken}, {@code pageSize}, {@code maxBatchSize}
     *         or {@code maxSeqLen} below 1 (Smile does not check the last two).
     * @throws IllegalStateException when the budget holds not even one page, or the application does not run under
     *         the launcher.
     */
    public static StaticKvBudget computeStaticKvBudget(long total, long free, double memFraction, long bytesPerToken,
                                                       int pageSize, int maxBatchSize, int maxSeqLen) {
        long[] b = Bridge.computeStaticKvBudget(total, free, memFraction, bytesPerToken, pageSize, maxBatchSize,
                maxSeqLen);
        return new StaticKvBudget(b[0], b[1], b[2], b[3], b[4], Math.toIntExact(b[5]), Math.toIntExact(b[6]));
    }

    /**
     * The slots a KV budget of {@code kvBudgetBytes} buys at {@code bytesPerToken}: floored to whole pages (at least
     * one page) and capped at {@code maxBatchSize * maxSeqLen} rounded up to whole pages (Python's
     * {@code slots_from_budget}, which {@link #computeStaticKvBudget} uses). Package-private, as in Smile.
     *
     * @throws IllegalArgumentException for a page size, bytes per token, batch or length below 1.
     */
    static SlotCount slotsFromBudget(long kvBudgetBytes, long bytesPerToken, int pageSize, int maxBatchSize,
                                     int maxSeqLen) {
        int[] s = Bridge.slotsFromBudget(kvBudgetBytes, bytesPerToken, pageSize, maxBatchSize, maxSeqLen);
        return new SlotCount(s[0], s[1]);
    }

    /** What {@link #slotsFromBudget} returns: the slots to allocate, and the most a full batch could use. */
    record SlotCount(int numSlots, int maxUsefulSlots) {}

    // ------------------------------------------------------------------ geometry and counters

    /** The number of attention layers. */
    public int numLayers() {
        return backend.numLayers();
    }

    /** The number of token slots. */
    public int numSlots() {
        return backend.numSlots();
    }

    /** The number of key/value heads. */
    public int numKvHeads() {
        return backend.numKvHeads();
    }

    /** The head dimension. */
    public int headDim() {
        return backend.headDim();
    }

    /** Tokens per page. */
    public int pageSize() {
        return backend.pageSize();
    }

    /** The storage dtype, as torch names it (for example "torch.float32"). */
    public String dtype() {
        return backend.dtype();
    }

    /**
     * The storage format of the model's KV layer {@code layer}: its name ({@code "bfloat16"}, {@code "fp8_e4m3"},
     * {@code "nvfp4"}, {@code "int4"}, ...) when its K and V are stored alike, else {@code "k=..., v=..."}.
     *
     * @throws IllegalArgumentException for a layer this pool does not hold (a pipeline stage holds its own range)
     */
    public String dtypeForLayer(int layer) {
        return backend.dtypeForLayer(layer);
    }

    /** The bytes one page of layer {@code layer}'s K takes as stored (a packed page's codes and scales). */
    public long kBlockStrideBytesForLayer(int layer) {
        return backend.kBlockStrideBytesForLayer(layer);
    }

    /** The bytes one page of layer {@code layer}'s V takes as stored. */
    public long vBlockStrideBytesForLayer(int layer) {
        return backend.vBlockStrideBytesForLayer(layer);
    }

    /** The dtype {@code get} returns and {@code put} takes (the storage dtype, except for FP8 storage). */
    public ScalarType computeDtype() {
        return backend.computeDtype();
    }

    /** True when K/V are stored in {@link #computeDtype()} (not FP8). */
    public boolean kvIsComputeDtype() {
        return backend.kvIsComputeDtype();
    }

    /** The FP8 K scale (1.0 for float storage). */
    public float kScale() {
        return backend.kScale();
    }

    /** The FP8 V scale (1.0 for float storage). */
    public float vScale() {
        return backend.vScale();
    }

    /** The device the K/V live on. */
    public Device device() {
        return backend.device();
    }

    /** Pages on the free list. */
    public int freePages() {
        return backend.freePages();
    }

    /** {@code freePages() * pageSize()}. */
    public int freeSlots() {
        return backend.freeSlots();
    }

    /** The smallest capacity among the active rows (0 without an active step). */
    public int requestCapacity() {
        return backend.requestCapacity();
    }

    /** Bound requests. */
    public int boundRequestCount() {
        return backend.boundRequestCount();
    }

    /** Whether binds match prompts against the tree and finishes insert into it. */
    public boolean isPrefixReuseEnabled() {
        return backend.isPrefixReuseEnabled();
    }

    /** Turns prefix reuse on or off (for later binds and finishes). */
    public void setPrefixReuseEnabled(boolean enabled) {
        backend.setPrefixReuseEnabled(enabled);
    }

    /** Prompt tokens of every bind made with reuse on (cumulative). */
    public long prefixPromptTokens() {
        return backend.prefixPromptTokens();
    }

    /** Matched prefix tokens of those binds (cumulative). */
    public long prefixMatchTokens() {
        return backend.prefixMatchTokens();
    }

    /** Tokens newly inserted into the tree by finishes (cumulative). */
    public long prefixInsertTokens() {
        return backend.prefixInsertTokens();
    }

    /** Tokens the pool evicted from the tree (cumulative). */
    public long prefixEvictTokens() {
        return backend.prefixEvictTokens();
    }

    /**
     * The pool's prefix tree (the same object every call): queries and {@code matchPrefix} work, mutations throw
     * {@link IllegalStateException} because the pool owns the tree's pages (see {@link RadixCache}).
     */
    public RadixCache radix() {
        return backend.radix();
    }

    /** The same tree as {@link #radix()}. */
    public RadixCache radixCache() {
        return backend.radixCache();
    }

    // ------------------------------------------------------------------ binding

    /**
     * Binds a request for continuous batching: matches the prompt in the tree, locks the match and takes private
     * pages for the whole page-aligned capacity (evicting unlocked prefixes only as far as needed). The only binding
     * becomes the active step.
     *
     * @return the request id (positive, never reused).
     * @throws KvCacheExhaustedException when the capacity cannot be had (nothing changed: keep the request queued).
     * @throws IllegalArgumentException when the prompt is longer than {@code totalCapacity}.
     */
    public int bindRequest(int[] promptTokens, int totalCapacity) {
        return backend.bindRequest(promptTokens, totalCapacity);
    }

    /**
     * Exclusive batch-1 bind: releases every other binding, clamps the capacity to what is free or evictable
     * (read {@link #requestCapacity()}), binds and activates.
     *
     * @return the matched prefix length.
     * @throws IllegalArgumentException when even the prompt does not fit (nothing is released then).
     */
    public int bindWithPrefix(int[] promptTokens, int totalCapacity) {
        return backend.bindWithPrefix(promptTokens, totalCapacity);
    }

    /**
     * Exclusive batch without prefix reuse, every row clamped to the same capacity. Smile returns nothing; the
     * bridge returns the ids (callers that ignore them compile alike).
     *
     * @throws KvCacheExhaustedException when a row cannot get one page (nothing is released then).
     */
    public int[] bindRequests(int batchSize, int capacity) {
        return backend.bindRequests(batchSize, capacity);
    }

    /**
     * Inserts the request's written, page-aligned prefix of {@code sequenceTokens} into the tree, frees duplicates
     * and unused headroom, unlocks and unbinds. A null sequence or reuse off: unbind without inserting. Unknown ids
     * do nothing.
     *
     * @throws IllegalArgumentException unless the sequence starts with the request's matched prefix.
     */
    public void finishRequest(int requestId, int[] sequenceTokens) {
        backend.finishRequest(requestId, sequenceTokens);
    }

    /** With exactly one binding, {@link #finishRequest(int, int[])} on it; with several, releases them all. */
    public void finishRequest(int[] sequenceTokens) {
        backend.finishRequest(sequenceTokens);
    }

    /** Instant eviction: frees the request's private pages and unlocks its prefix, inserting nothing. */
    public void unbindRequest(int requestId) {
        backend.unbindRequest(requestId);
    }

    /** Releases every binding without inserting. */
    public void unbindRequests() {
        backend.unbindRequests();
    }

    /** Whether {@code requestId} is bound. */
    public boolean isBound(int requestId) {
        return backend.isBound(requestId);
    }

    /** The request's matched prefix length (0 for an unknown id). */
    public int matchedPrefixLen(int requestId) {
        return backend.matchedPrefixLen(requestId);
    }

    /**
     * The end of the request's contiguous written KV.
     *
     * @throws IllegalArgumentException for an unknown id.
     */
    public int kvLen(int requestId) {
        return backend.kvLen(requestId);
    }

    /**
     * The batch, in order, that {@code put}, {@code get}, the metadata, seal and graph calls act on.
     *
     * @throws IllegalArgumentException for no, unknown or duplicate ids (the previous step is kept).
     */
    public void activateStep(int... requestIds) {
        backend.activateStep(requestIds);
    }

    /** The active step's ids in order (empty without one). */
    public int[] activeRequestIds() {
        return backend.activeRequestIds();
    }

    /**
     * @throws KvCacheExhaustedException unless the active step has {@code batchSize} rows, each with capacity
     *         {@code >= endPos}.
     */
    public void ensureRequest(int batchSize, int endPos) {
        backend.ensureRequest(batchSize, endPos);
    }

    // ------------------------------------------------------------------ K/V (direct native-order buffers)

    /**
     * Writes positions {@code [startPos, startPos + seqLen)} of every active row of {@code layer}: {@code k} and
     * {@code v} hold {@code [B, seqLen, numKvHeads, headDim]} values of {@link #computeDtype()}. With
     * {@link #setDecodeGraphBuffers decode graph buffers} on and {@code seqLen == 1}, or with
     * {@link #setVerifyGraphBuffers verify graph buffers} on, the write goes through the prepared fixed index
     * ({@link IllegalStateException} if none is prepared for this shape).
     *
     * @throws KvCacheExhaustedException past a row's capacity; {@link IllegalArgumentException} below its matched
     *         prefix or for a bad buffer.
     */
    public void put(int layer, int startPos, int seqLen, ByteBuffer k, ByteBuffer v) {
        backend.put(layer, startPos, seqLen, k, v);
    }

    /** Like {@link #put(int, int, int, ByteBuffer, ByteBuffer)} with one start position per active row. */
    public void put(int layer, int[] startPositions, int seqLen, ByteBuffer k, ByteBuffer v) {
        backend.put(layer, startPositions, seqLen, k, v);
    }

    /**
     * Copies positions {@code [0, length)} of every active row into {@code k} and {@code v}
     * ({@code [B, length, numKvHeads, headDim]} of {@link #computeDtype()}).
     *
     * @throws IllegalArgumentException beyond the smallest active capacity, or for a bad buffer.
     */
    public void get(int layer, int length, ByteBuffer k, ByteBuffer v) {
        backend.get(layer, length, k, v);
    }

    /**
     * Like {@link #get} for rows of different capacity: {@code length} may reach the largest active capacity, and a
     * row's positions past its own capacity read its last slot again (mask them).
     */
    public void getPadded(int layer, int length, ByteBuffer k, ByteBuffer v) {
        backend.getPadded(layer, length, k, v);
    }

    /**
     * The pool's own K buffer of {@code layer}, {@code [numSlots, numKvHeads, headDim]} values of the storage dtype
     * in native byte order, shared without a copy (writes are seen by both sides). CPU pools only: on a GPU the KV
     * stays in Python ({@link IllegalStateException}). The buffer stays valid after {@link #close()}.
     */
    public ByteBuffer keyLayer(int layer) {
        return backend.keyLayer(layer);
    }

    /** The V buffer of {@code layer}; see {@link #keyLayer(int)}. */
    public ByteBuffer valueLayer(int layer) {
        return backend.valueLayer(layer);
    }

    /** Physical slot ids of positions {@code [0, length)} of every active row, row-major. */
    public long[] slotIndices(int length) {
        return backend.slotIndices(length);
    }

    /** Physical slot ids of positions {@code [startPos[b], startPos[b] + seqlen)} of every active row, row-major. */
    public long[] slotIndices(int[] startPos, int seqlen) {
        return backend.slotIndices(startPos, seqlen);
    }

    /**
     * Caller-owned, page-aligned slots, evicting from the tree if needed.
     *
     * @throws KvCacheExhaustedException if they cannot be had.
     */
    public long[] alloc(int numTokens) {
        return backend.alloc(numTokens);
    }

    /**
     * Returns whole caller-owned pages.
     *
     * @throws IllegalArgumentException for a partial page, a page listed twice, or a page the caller does not own
     *         (nothing is freed then).
     */
    public void free(long[] slots) {
        backend.free(slots);
    }

    /** Evicts at least {@code numTokens} unlocked cached tokens (LRU, whole nodes) unless the tree runs out. */
    public int evict(int numTokens) {
        return backend.evict(numTokens);
    }

    // ------------------------------------------------------------------ FlashInfer CSR, seal and truncate
    // (a verb with an int instead of an int[] gives that value to every active row: the two are the same call)

    /**
     * The step CSR of the active rows at {@code lengths}, which every layer of one forward shares: the same
     * object while the lengths are unchanged or every row keeps its page count (then only {@code lastPageLen} is
     * rewritten in place), a new one after a rebuild (a page boundary crossed, another cohort of rows). Do not
     * close it.
     *
     * @throws IllegalArgumentException for a length beyond a row's capacity.
     */
    public FlashInferKvMetadata sharedFlashInferMetadata(int[] lengths) {
        return backend.sharedFlashInferMetadata(lengths);
    }

    /** {@link #sharedFlashInferMetadata(int[])} with every active row at {@code length}. */
    public FlashInferKvMetadata sharedFlashInferMetadata(int length) {
        return backend.sharedFlashInferMetadata(length);
    }

    /**
     * A new, fixed CSR of the active rows at {@code lengths} (0 gives an empty row with {@code lastPageLen} 0).
     *
     * @throws IllegalArgumentException for a length beyond a row's capacity.
     */
    public FlashInferKvMetadata buildFlashInferMetadata(int[] lengths) {
        return backend.buildFlashInferMetadata(lengths);
    }

    /** {@link #buildFlashInferMetadata(int[])} with every active row at {@code length}. */
    public FlashInferKvMetadata buildFlashInferMetadata(int length) {
        return backend.buildFlashInferMetadata(length);
    }

    /** The step CSR as it stands (the same object {@link #sharedFlashInferMetadata} returned), or null if none. */
    public FlashInferKvMetadata currentStepFlashInferMetadata() {
        return backend.currentStepFlashInferMetadata();
    }

    /** Forgets the step CSR: the next {@link #sharedFlashInferMetadata(int[])} rebuilds it (a new object). */
    public void clearStepMetadata() {
        backend.clearStepMetadata();
    }

    /** Smile's name of {@link #clearStepMetadata()}. */
    public void clearStepFlashInferMetadata() {
        backend.clearStepFlashInferMetadata();
    }

    /**
     * Attention sees only {@code [0, sealedLen)} of each active row from now on; frees nothing and lowers
     * {@link #kvLen} to at most {@code sealedLen} (never below the matched prefix).
     *
     * @return true when the step CSR was kept or rewritten in place (the same object, tensor addresses survive),
     *         false when it was rebuilt (drop graphs captured on the old one).
     */
    public boolean sealLength(int[] sealedLen) {
        return backend.sealLength(sealedLen);
    }

    /** {@link #sealLength(int[])} with every active row at {@code sealedLen}. */
    public boolean sealLength(int sealedLen) {
        return backend.sealLength(sealedLen);
    }

    /**
     * After a verify window wrote up to {@code writtenEnd}, seals to {@code sealedLen}, zeroing the rejected tail
     * {@code [sealedLen, writtenEnd)} first only when {@link #zeroRejectedKv()} is on (off by default, on with
     * {@code SMILE_MTP_ZERO_REJECTED_KV=1}; see {@link #truncateTo(int[], int[], boolean)} to choose per call).
     * The rejected tail is invisible to attention either way and is overwritten by the next window.
     *
     * @return what {@link #sealLength(int[])} returns.
     * @throws IllegalArgumentException if {@code writtenEnd < sealedLen} or beyond a row's capacity.
     */
    public boolean truncateTo(int[] sealedLen, int[] writtenEnd) {
        return backend.truncateTo(sealedLen, writtenEnd);
    }

    /** {@link #truncateTo(int[], int[])} with the same values for every active row. */
    public boolean truncateTo(int sealedLen, int writtenEnd) {
        return backend.truncateTo(sealedLen, writtenEnd);
    }

    /**
     * {@link #truncateTo(int[], int[])}, zeroing K and V of the rejected tail {@code [sealedLen, writtenEnd)} on
     * every layer first when {@code zeroRejected} is true (and never when false), whatever {@link #zeroRejectedKv()}
     * says. Reads of the tail then return zeros, as after Smile's {@code truncateTo}.
     *
     * @throws IllegalArgumentException as {@link #truncateTo(int[], int[])}, and when zeroing would reach below a
     *         row's matched prefix (the tree's pages are never written).
     */
    public boolean truncateTo(int[] sealedLen, int[] writtenEnd, boolean zeroRejected) {
        return backend.truncateTo(sealedLen, writtenEnd, zeroRejected);
    }

    /** {@link #truncateTo(int[], int[], boolean)} with the same values for every active row. */
    public boolean truncateTo(int sealedLen, int writtenEnd, boolean zeroRejected) {
        return backend.truncateTo(sealedLen, writtenEnd, zeroRejected);
    }

    /** Whether {@link #truncateTo(int[], int[])} zeroes the rejected tail (Python's {@code zero_rejected_kv}). */
    public boolean zeroRejectedKv() {
        return backend.zeroRejectedKv();
    }

    /** Sets {@link #zeroRejectedKv()} for later {@code truncateTo} calls without the boolean. */
    public void setZeroRejectedKv(boolean on) {
        backend.setZeroRejectedKv(on);
    }

    /**
     * Zeroes K and V of {@code [fromPos, endPos)} on every layer of the active rows; {@link #kvLen} drops to at most
     * {@code fromPos}.
     *
     * @throws IllegalArgumentException for a reversed range, one past a capacity or one below a matched prefix.
     */
    public void invalidateRange(int[] fromPos, int[] endPos) {
        backend.invalidateRange(fromPos, endPos);
    }

    /** {@link #invalidateRange(int[], int[])} with the same values for every active row. */
    public void invalidateRange(int fromPos, int endPos) {
        backend.invalidateRange(fromPos, endPos);
    }

    // ------------------------------------------------------------------ page buckets

    /** Pages a row of {@code length} tokens spans: {@code ceil(length / pageSize)}. */
    public int numPagesForLength(int length) {
        return backend.numPagesForLength(length);
    }

    /** Decode steps until {@code cacheLen} fills its last page (0 when it just did). */
    public int stepsUntilPageBoundary(int cacheLen) {
        return backend.stepsUntilPageBoundary(cacheLen);
    }

    /** The first length that needs {@code numPages + 1} pages: {@code numPages * pageSize + 1}. */
    public int firstCacheLenInNextPageBucket(int numPages) {
        return backend.firstCacheLenInNextPageBucket(numPages);
    }

    // ------------------------------------------------------------------ CUDA-graph fixed buffers
    // One graph CSR serves decode and verify graphs alike; it is a pool-owned FlashInferKvMetadata (the same object
    // for the buffers' life, rewritten in place by every prepare) and moves only when more rows are reserved. The
    // calls work on every device; the index tensors are host copies of the fixed device buffers.

    /** Whether a {@code put} of one token per row writes through the prepared decode index. */
    public boolean decodeGraphBuffers() {
        return backend.decodeGraphBuffers();
    }

    /** Turns the decode-graph write path of {@code put} on or off. */
    public void setDecodeGraphBuffers(boolean on) {
        backend.setDecodeGraphBuffers(on);
    }

    /** Whether {@code put} writes through the prepared verify index. */
    public boolean verifyGraphBuffers() {
        return backend.verifyGraphBuffers();
    }

    /** Turns the verify-graph write path of {@code put} on or off. */
    public void setVerifyGraphBuffers(boolean on) {
        backend.setVerifyGraphBuffers(on);
    }

    /** Whether small verify windows may take the paged verify kernel eagerly (set during an MTP verify forward). */
    public boolean verifyWindowKernel() {
        return backend.verifyWindowKernel();
    }

    /** Sets {@link #verifyWindowKernel()}. */
    public void setVerifyWindowKernel(boolean on) {
        backend.setVerifyWindowKernel(on);
    }

    /**
     * Prepares a decode step that writes position {@code positions[b]} of each active row
     * ({@code cacheLen == positions[b] + 1}): rewrites the graph CSR in place for {@code cacheLen} and the fixed
     * {@code [B]} write index, and counts as a write of those positions (a replayed graph never calls put). The
     * step CSR is left alone.
     *
     * @return the graph CSR.
     * @throws IllegalArgumentException unless {@code cacheLen == positions[b] + 1} for every row, within capacity.
     */
    public FlashInferKvMetadata prepareDecodeGraphStep(int cacheLen, int[] positions) {
        return backend.prepareDecodeGraphStep(cacheLen, positions);
    }

    /** {@link #prepareDecodeGraphStep(int, int[])} with one cache length per row. */
    public FlashInferKvMetadata prepareDecodeGraphStep(int[] cacheLens, int[] positions) {
        return backend.prepareDecodeGraphStep(cacheLens, positions);
    }

    /**
     * Sizes the graph CSR for up to {@code rows} rows of the pool's full page count, so no later graph step of at
     * most {@code rows} rows moves it. Growing it moves it ({@link #consumeVerifyGraphMetaRealloc()} reports that).
     */
    public void reserveGraphRows(int rows) {
        backend.reserveGraphRows(rows);
    }

    /**
     * The graph CSR a decode (or verify) graph of {@code batch} rows reads: the same object for the buffers' life.
     *
     * @throws IllegalStateException if fewer than {@code batch} rows are reserved.
     */
    public FlashInferKvMetadata decodeGraphMetadata(int batch) {
        return backend.decodeGraphMetadata(batch);
    }

    /**
     * The fixed {@code Int64 [batch]} decode write index as it stands (a host copy: the same {@link Tensor} object
     * while the index is unchanged).
     *
     * @throws IllegalStateException unless a decode step of {@code batch} rows is prepared for the active step.
     */
    public Tensor decodeGraphIndex(int batch) {
        return backend.decodeGraphIndex(batch);
    }

    /**
     * Starts capturing a decode graph for a later page bucket: the live step CSR is set aside, a CSR for
     * {@code cacheLen} over the live page table is installed (returned), and every row's write of position
     * {@code cachePos} goes to scratch slots the pool owns, so the capture never writes live KV. Calls that change
     * the step CSR throw {@link IllegalStateException} until {@link #endPrefetchDecodeGraphStep()}.
     *
     * @throws IllegalArgumentException if {@code batch} is not the active batch or a length is out of range.
     * @throws KvCacheExhaustedException if the scratch pages cannot be had.
     */
    public FlashInferKvMetadata beginPrefetchDecodeGraphStep(int cacheLen, int cachePos, int batch) {
        return backend.beginPrefetchDecodeGraphStep(cacheLen, cachePos, batch);
    }

    /**
     * Ends the prefetch: restores the live step CSR and returns the prefetch one (for
     * {@link #installPrefetchedStepMetadata}). The decode index must be prepared again before the next decode put.
     *
     * @throws IllegalStateException if no prefetch is in progress.
     */
    public FlashInferKvMetadata endPrefetchDecodeGraphStep() {
        return backend.endPrefetchDecodeGraphStep();
    }

    /**
     * Makes {@code meta} the step CSR for every active row at {@code uniformLen}: the prefetched CSR itself (the
     * same object and device tensors) when it is one of this pool's, else a CSR built from {@code meta}'s values.
     *
     * @throws IllegalArgumentException if its batch differs from the active step's, or it does not describe the
     *         active rows at {@code uniformLen}.
     */
    public void installPrefetchedStepMetadata(FlashInferKvMetadata meta, int uniformLen) {
        if (meta == null) throw new IllegalArgumentException("meta must not be null");
        backend.installPrefetchedStepMetadata(meta.source(), meta, uniformLen);
    }

    /**
     * Prepares a verify window of {@code windowLen} tokens per active row
     * ({@code cacheLen == startPositions[b] + windowLen}): rewrites the graph CSR in place and the fixed
     * {@code [B * windowLen]} write index, and counts as a write of the windows.
     *
     * @return the graph CSR.
     * @throws IllegalArgumentException unless the lengths agree, within capacity and not below a matched prefix.
     */
    public FlashInferKvMetadata prepareVerifyGraphStep(int cacheLen, int[] startPositions, int windowLen) {
        return backend.prepareVerifyGraphStep(cacheLen, startPositions, windowLen);
    }

    /** {@link #prepareVerifyGraphStep(int, int[], int)} with one cache length per row (ragged windows). */
    public FlashInferKvMetadata prepareVerifyGraphStep(int[] cacheLens, int[] startPositions, int windowLen) {
        return backend.prepareVerifyGraphStep(cacheLens, startPositions, windowLen);
    }

    /**
     * The eager form of {@link #prepareVerifyGraphStep(int, int[], int)}: the step CSR for the windows (kept,
     * rewritten or rebuilt as {@link #sharedFlashInferMetadata(int[])}) and the write index for {@code put} with
     * verify graph buffers on; the windows count as written only once put.
     */
    public FlashInferKvMetadata prepareVerifyStep(int cacheLen, int[] startPositions, int windowLen) {
        return backend.prepareVerifyStep(cacheLen, startPositions, windowLen);
    }

    /** {@link #prepareVerifyStep(int, int[], int)} with one cache length per row. */
    public FlashInferKvMetadata prepareVerifyStep(int[] cacheLens, int[] startPositions, int windowLen) {
        return backend.prepareVerifyStep(cacheLens, startPositions, windowLen);
    }

    /**
     * The fixed {@code Int64 [batch * windowLen]} verify write index as it stands (a host copy: the same
     * {@link Tensor} object while the index is unchanged).
     *
     * @throws IllegalStateException unless that shape is prepared for the active step.
     */
    public Tensor verifyGraphIndex(int batch, int windowLen) {
        return backend.verifyGraphIndex(batch, windowLen);
    }

    /**
     * The graph CSR of the last {@link #prepareVerifyGraphStep(int, int[], int)}.
     *
     * @throws IllegalStateException if none was prepared.
     */
    public FlashInferKvMetadata verifyGraphMetadata() {
        return backend.verifyGraphMetadata();
    }

    /**
     * True once after the graph CSR moved to new buffers (its first allocation and every growth of the reserved
     * rows): drop graphs captured on the old ones.
     */
    public boolean consumeVerifyGraphMetaRealloc() {
        return backend.consumeVerifyGraphMetaRealloc();
    }

    /**
     * The query-side indptr {@code [0, W, 2W, .., B*W]} ({@code Int32}) of verify windows of {@code windowLen}
     * tokens for {@code batch} rows: one fixed tensor per shape for the pool's life, so the same {@link Tensor}
     * object every call with the same shape (a host copy of the pool's device buffer).
     *
     * @throws IllegalArgumentException for {@code batch} or {@code windowLen} below 1.
     */
    public Tensor verifyQoIndptrBuf(int batch, int windowLen) {
        return backend.verifyQoIndptrBuf(batch, windowLen);
    }

    // ------------------------------------------------------------------ audit and lifetime

    /** Throws {@link IllegalStateException} naming the first broken page if the pool's bookkeeping is corrupt. */
    public void checkInvariants() {
        backend.checkInvariants();
    }

    /** Counters and page ownership, as a JSON object. */
    public String statsJson() {
        return backend.statsJson();
    }

    /** Releases every binding and the buffers; idempotent. Every later call but {@code close} throws. */
    @Override
    public void close() {
        backend.close();
    }
}
