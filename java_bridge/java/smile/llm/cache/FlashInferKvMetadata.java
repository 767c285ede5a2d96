package smile.llm.cache;

import java.util.Arrays;
import smile.deep.tensor.ScalarType;
import smile.deep.tensor.Tensor;

/**
 * FlashInfer's paged-KV page table in CSR form, as Smile's {@code FlashInferKvMetadata}: three {@code Int32}
 * tensors and the page size.
 * <ul>
 *   <li>{@link #pagedKvIndptr()}: {@code [B + 1]} offsets; row {@code b} owns entries
 *       {@code indptr[b] .. indptr[b + 1]} of the indices;</li>
 *   <li>{@link #pagedKvIndices()}: the physical page of each logical page of each row, rows one after the other.
 *       A pool's CUDA-graph CSR keeps room for page growth, so only its leading {@code indptr[B]} entries are
 *       meaningful there;</li>
 *   <li>{@link #pagedKvLastPageLen()}: {@code [B]} tokens in each row's last page, in {@code [1, pageSize]} for a
 *       row that holds tokens and 0 for an empty row.</li>
 * </ul>
 *
 * <p>A metadata object comes in two kinds:
 * <ul>
 *   <li><b>Fixed</b>: made with {@link #FlashInferKvMetadata(Tensor, Tensor, Tensor, int)} or returned by
 *       {@link KvCachePool#buildFlashInferMetadata(int[])}. Its tensors never change.</li>
 *   <li><b>Pool-owned</b>: the step CSR and the graph CSRs ({@link KvCachePool#sharedFlashInferMetadata(int[])},
 *       the graph and prefetch calls). The pool rewrites such a CSR in place between steps (a decode step inside a
 *       page only rewrites {@code lastPageLen}), and the pool hands back the same object for as long as it keeps
 *       that CSR. Each accessor returns the CSR's current values: the same {@link Tensor} object as the previous
 *       call while that part is unchanged, a new one after the pool rewrote it.</li>
 * </ul>
 *
 * <p>Differences from Smile, where the record holds LibTorch tensors on the pool's device: the tensors here are
 * host copies ({@code device()} is the CPU), because the bridge's {@link Tensor} is a host array. A tensor already
 * read does not change when the pool rewrites the CSR (call the accessor again). This is a class, not a record:
 * equality is identity. {@link #close()} does nothing, since the pool owns its CSRs and host arrays need no
 * freeing.
 */
public final class FlashInferKvMetadata implements AutoCloseable {
    /**
     * Reads a pool-owned CSR; implemented by the bridge's Python side, not by applications.
     */
    public interface Source {
        /**
         * The current values of one part of the CSR.
         *
         * @param part 0 for {@code indptr}, 1 for {@code indices}, 2 for {@code lastPageLen}.
         * @return a new array of the part's current values.
         */
        int[] read(int part);
    }

    private static final String[] PARTS = {"indptr", "indices", "lastPageLen"};

    /** Null for a fixed CSR. */
    private final Source source;
    private final int pageSize;
    /** The tensors handed out, by part; for a pool-owned CSR also the values they hold. */
    private final Tensor[] tensors = new Tensor[3];
    private final int[][] values = new int[3][];

    /**
     * A fixed CSR of the given tensors, as Smile's record constructor. Nothing is checked or copied.
     *
     * @param pagedKvIndptr the {@code [B + 1]} row offsets.
     * @param pagedKvIndices the physical pages of every row, rows one after the other.
     * @param pagedKvLastPageLen the {@code [B]} tokens in each row's last page.
     * @param pageSize tokens per page.
     */
    public FlashInferKvMetadata(Tensor pagedKvIndptr, Tensor pagedKvIndices, Tensor pagedKvLastPageLen,
                                int pageSize) {
        this.source = null;
        this.pageSize = pageSize;
        tensors[0] = pagedKvIndptr;
        tensors[1] = pagedKvIndices;
        tensors[2] = pagedKvLastPageLen;
    }

    /**
     * A pool-owned CSR read through {@code source}; made by the bridge, not by applications.
     *
     * @throws IllegalArgumentException for a null source.
     */
    public FlashInferKvMetadata(Source source, int pageSize) {
        if (source == null) throw new IllegalArgumentException("source must not be null");
        this.source = source;
        this.pageSize = pageSize;
    }

    /** The {@code [B + 1]} row offsets into {@link #pagedKvIndices()} ({@code Int32}). */
    public Tensor pagedKvIndptr() {
        return part(0);
    }

    /** The physical page of each logical page of each row, rows one after the other ({@code Int32}). */
    public Tensor pagedKvIndices() {
        return part(1);
    }

    /** The {@code [B]} tokens in each row's last page ({@code Int32}). */
    public Tensor pagedKvLastPageLen() {
        return part(2);
    }

    /** Tokens per page. */
    public int pageSize() {
        return pageSize;
    }

    /** True for a CSR the pool owns and may rewrite in place; false for a fixed one. */
    public boolean isPoolOwned() {
        return source != null;
    }

    /** The source of a pool-owned CSR, null for a fixed one (for {@link KvCachePool}). */
    Source source() {
        return source;
    }

    /** Does nothing: the pool owns its CSRs, and host tensors hold no native memory. */
    @Override
    public void close() {}

    @Override
    public String toString() {
        return "FlashInferKvMetadata(pageSize=" + pageSize + (source != null ? ", pool-owned" : ", fixed")
                + ", indptr=" + describe(pagedKvIndptr()) + ", lastPageLen=" + describe(pagedKvLastPageLen()) + ")";
    }

    private static String describe(Tensor t) {
        if (t == null) return "null";
        return t.dtype() == ScalarType.Int32 && t.length() <= 16 ? Arrays.toString(t.intArray()) : t.toString();
    }

    private synchronized Tensor part(int i) {
        if (source == null) return tensors[i];
        int[] now = source.read(i);
        if (now == null) throw new IllegalStateException("the pool returned no " + PARTS[i] + " for its CSR");
        if (tensors[i] == null || !Arrays.equals(values[i], now)) {
            values[i] = now;
            tensors[i] = Tensor.of(now);
        }
        return tensors[i];
    }
}
