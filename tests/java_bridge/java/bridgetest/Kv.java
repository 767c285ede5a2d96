package bridgetest;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import smile.llm.cache.FlashInferKvMetadata;
import smile.llm.cache.KvCachePool;

/** Direct float32 K/V buffers {@code [B, S, H, D]} for the pool's put/get, with exactly representable values. */
public final class Kv {
    private Kv() {}

    public static ByteBuffer floats(int n) {
        return ByteBuffer.allocateDirect(Math.max(1, n) * 4).order(ByteOrder.nativeOrder());
    }

    public static ByteBuffer fill(int n, float value) {
        ByteBuffer b = floats(n);
        for (int i = 0; i < n; i++) b.putFloat(i * 4, value);
        return b;
    }

    /** The value of element {@code [row, pos, h, d]}: distinct for every element, exact in float32. */
    public static float value(int row, int pos, int h, int d, boolean isV) {
        float x = row * 100_000f + pos * 1_000f + h * 100f + d + 0.5f;
        return isV ? -x : x;
    }

    /** A buffer for {@code rows} rows at positions {@code start[row] + s}, {@code s < seq}, holding {@link #value}. */
    public static ByteBuffer pattern(int[] start, int seq, int heads, int dim, boolean isV) {
        ByteBuffer b = floats(start.length * seq * heads * dim);
        int i = 0;
        for (int r = 0; r < start.length; r++)
            for (int s = 0; s < seq; s++)
                for (int h = 0; h < heads; h++)
                    for (int d = 0; d < dim; d++) b.putFloat(4 * i++, value(r, start[r] + s, h, d, isV));
        return b;
    }

    /** Element {@code [row, pos, h, d]} of a {@code [B, len, H, D]} buffer. */
    public static float at(ByteBuffer b, int len, int heads, int dim, int row, int pos, int h, int d) {
        return b.getFloat(4 * (((row * len + pos) * heads + h) * dim + d));
    }

    /** The parts of a CSR as {indptr, indices, lastPageLen}. */
    public static int[][] csr(FlashInferKvMetadata meta) {
        return new int[][] {meta.pagedKvIndptr().intArray(), meta.pagedKvIndices().intArray(),
                meta.pagedKvLastPageLen().intArray()};
    }

    /** Puts {@code value}-filled K and V at {@code start} for {@code seq} positions of every active row. */
    public static void putConst(KvCachePool pool, int layer, int start, int seq, float k, float v) {
        int rows = pool.activeRequestIds().length;
        int n = rows * seq * pool.numKvHeads() * pool.headDim();
        pool.put(layer, start, seq, fill(n, k), fill(n, v));
    }

    /** K and V of positions {@code [0, len)} of every active row, as {k, v}. */
    public static ByteBuffer[] get(KvCachePool pool, int layer, int len) {
        int n = pool.activeRequestIds().length * len * pool.numKvHeads() * pool.headDim();
        ByteBuffer k = floats(n), v = floats(n);
        pool.get(layer, len, k, v);
        return new ByteBuffer[] {k, v};
    }

    /** Checks row {@code row}, positions {@code [from, to)} of a {@code [B, len, H, D]} read against
     *  {@link #value} as written by row {@code writerRow} of an earlier put. */
    public static void checkPattern(ByteBuffer b, int len, int heads, int dim, int row, int writerRow, int from,
                                    int to, boolean isV, String what) {
        for (int p = from; p < to; p++)
            for (int h = 0; h < heads; h++)
                for (int d = 0; d < dim; d++) {
                    float want = value(writerRow, p, h, d, isV), got = at(b, len, heads, dim, row, p, h, d);
                    if (Float.compare(want, got) != 0) {
                        throw new AssertionError(what + ": [" + row + "," + p + "," + h + "," + d + "] expected "
                                + want + ", got " + got);
                    }
                }
    }

    /** Checks that every element of row {@code row}, positions {@code [from, to)} equals {@code want}. */
    public static void checkConst(ByteBuffer b, int len, int heads, int dim, int row, int from, int to, float want,
                                  String what) {
        for (int p = from; p < to; p++)
            for (int h = 0; h < heads; h++)
                for (int d = 0; d < dim; d++) {
                    float got = at(b, len, heads, dim, row, p, h, d);
                    if (Float.compare(want, got) != 0) {
                        throw new AssertionError(what + ": [" + row + "," + p + "," + h + "," + d + "] expected "
                                + want + ", got " + got);
                    }
                }
    }
}
