package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import smile.llm.cache.KvCachePool;

/**
 * Java NIO semantics of the pool's ByteBuffer arguments: each is read or written from its {@code position()} for the
 * values the call needs, within {@code limit()}, and the call leaves position and limit as they were (like Java's
 * absolute bulk methods). Slices, read-only input buffers and unaligned positions work; a read-only output buffer,
 * too few bytes remaining and a slice left big-endian are IllegalArgumentException. Pools are {@link Audited}.
 */
public final class NioScenarios {
    static final int H = 2, D = 4, S = 3;
    static final int N = S * H * D; // floats of one row, S positions
    static final float SENTINEL = -7.25f;

    private NioScenarios() {}

    static KvCachePool pool() {
        KvCachePool pool = Audited.pool(1, 32, H, D, 16);
        pool.bindRequests(1, 16);
        return pool;
    }

    /** A direct native buffer of {@code before} sentinel bytes, {@code src}'s bytes, then 8 sentinel bytes, with
     *  position {@code before} and limit at the end of {@code src}'s bytes. */
    static ByteBuffer embed(ByteBuffer src, int before) {
        int n = src.capacity();
        ByteBuffer b = ByteBuffer.allocateDirect(before + n + 8).order(ByteOrder.nativeOrder());
        for (int i = 0; i < b.capacity(); i++) b.put(i, (byte) 0x5A);
        for (int i = 0; i < n; i++) b.put(before + i, src.get(i));
        b.position(before).limit(before + n);
        return b;
    }

    static void checkUnchanged(ByteBuffer b, int position, int limit, String what) {
        eq(position, b.position(), what + " position");
        eq(limit, b.limit(), what + " limit");
    }

    @Scenario
    public static void putWhenPositionedThenReadsFromPositionAndKeepsIt(List<String> log) {
        try (KvCachePool pool = pool()) {
            int[] start = {0};
            ByteBuffer k = embed(Kv.pattern(start, S, H, D, false), 12);
            ByteBuffer v = embed(Kv.pattern(start, S, H, D, true), 6); // 6: not float aligned
            pool.put(0, 0, S, k, v);
            checkUnchanged(k, 12, 12 + 4 * N, "k");
            checkUnchanged(v, 6, 6 + 4 * N, "v");
            ByteBuffer[] kv = Kv.get(pool, 0, S);
            Kv.checkPattern(kv[0], S, H, D, 0, 0, 0, S, false, "K read back");
            Kv.checkPattern(kv[1], S, H, D, 0, 0, 0, S, true, "V read back");
        }
    }

    @Scenario
    public static void getWhenPositionedThenWritesOnlyFromPosition(List<String> log) {
        try (KvCachePool pool = pool()) {
            int[] start = {0};
            pool.put(0, 0, S, Kv.pattern(start, S, H, D, false), Kv.pattern(start, S, H, D, true));
            ByteBuffer k = ByteBuffer.allocateDirect(8 + 4 * N + 20).order(ByteOrder.nativeOrder());
            for (int i = 0; i < k.capacity(); i += 4) k.putFloat(i, SENTINEL);
            k.position(8).limit(k.capacity()); // 20 bytes more than needed remain
            ByteBuffer v = Kv.floats(N);
            pool.get(0, S, k, v);
            checkUnchanged(k, 8, 8 + 4 * N + 20, "k");
            eq(SENTINEL, k.getFloat(0), "before the position");
            eq(SENTINEL, k.getFloat(4), "before the position");
            eq(SENTINEL, k.getFloat(8 + 4 * N), "after the values");
            eq(SENTINEL, k.getFloat(8 + 4 * N + 16), "the last float");
            Kv.checkPattern(k.slice().order(ByteOrder.nativeOrder()), S, H, D, 0, 0, 0, S, false, "K at position 8");
            Kv.checkPattern(v, S, H, D, 0, 0, 0, S, true, "V");
            eq(Kv.value(0, 0, 0, 0, false), k.getFloat(8), "first value at the position");
        }
    }

    @Scenario
    public static void sliceWhenNativeOrderThenViewsItsOwnRegion(List<String> log) {
        try (KvCachePool pool = pool()) {
            int[] start = {0};
            ByteBuffer whole = embed(Kv.pattern(start, S, H, D, false), 40);
            ByteBuffer slice = whole.slice(); // position 0 of the slice is byte 40 of whole; big-endian again
            expect(IllegalArgumentException.class, "native byte order", () -> pool.put(0, 0, S, slice, slice));
            slice.order(ByteOrder.nativeOrder());
            pool.put(0, 0, S, slice, Kv.pattern(start, S, H, D, true));
            Kv.checkPattern(Kv.get(pool, 0, S)[0], S, H, D, 0, 0, 0, S, false, "K from the slice");
            ByteBuffer out = ByteBuffer.allocateDirect(16 + 4 * N).order(ByteOrder.nativeOrder());
            out.position(16);
            ByteBuffer outSlice = out.slice().order(ByteOrder.nativeOrder());
            pool.get(0, S, outSlice, Kv.floats(N));
            eq(Kv.value(0, 2, 1, 3, false), out.getFloat(16 + 4 * (N - 1)), "the slice wrote into its parent at 16");
            eq(0.0, out.getFloat(12), "nothing before the slice");
            checkUnchanged(outSlice, 0, 4 * N, "slice");
        }
    }

    @Scenario
    public static void readOnlyWhenInputThenReadWhenOutputThenRefused(List<String> log) {
        try (KvCachePool pool = pool()) {
            int[] start = {0};
            ByteBuffer k = embed(Kv.pattern(start, S, H, D, false), 4).asReadOnlyBuffer()
                    .order(ByteOrder.nativeOrder());
            ByteBuffer v = Kv.pattern(start, S, H, D, true).asReadOnlyBuffer().order(ByteOrder.nativeOrder());
            check(k.isReadOnly() && k.isDirect(), "a read-only direct buffer");
            pool.put(0, 0, S, k, v);
            checkUnchanged(k, 4, 4 + 4 * N, "read-only k");
            ByteBuffer[] kv = Kv.get(pool, 0, S);
            Kv.checkPattern(kv[0], S, H, D, 0, 0, 0, S, false, "K from a read-only buffer");
            Kv.checkPattern(kv[1], S, H, D, 0, 0, 0, S, true, "V from a read-only buffer");
            ByteBuffer ro = Kv.floats(N).asReadOnlyBuffer().order(ByteOrder.nativeOrder());
            ByteBuffer kOut = Kv.fill(N, SENTINEL);
            log.add(expect(IllegalArgumentException.class, "v is a read-only ByteBuffer",
                    () -> pool.get(0, S, kOut, ro)).getMessage());
            eq(SENTINEL, kOut.getFloat(0), "a refused get writes nothing");
            expect(IllegalArgumentException.class, "k is a read-only ByteBuffer", () -> pool.getPadded(0, S, ro, kOut));
        }
    }

    @Scenario
    public static void remainingWhenTooSmallThenIllegalArgumentNamingSizes(List<String> log) {
        try (KvCachePool pool = pool()) {
            int id = pool.activeRequestIds()[0];
            ByteBuffer big = Kv.floats(N);
            ByteBuffer k = Kv.floats(N);
            k.position(4); // capacity suffices, remaining() does not
            String message = "k has " + (4 * N - 4) + " bytes remaining (position 4, limit " + 4 * N + "), need "
                    + 4 * N + " for [1, 3, 2, 4] torch.float32";
            log.add(expect(IllegalArgumentException.class, message,
                    () -> pool.put(0, 0, S, k, big)).getMessage());
            ByteBuffer v = Kv.floats(N);
            v.limit(4 * N - 1);
            expect(IllegalArgumentException.class, "v has " + (4 * N - 1) + " bytes remaining",
                    () -> pool.put(0, 0, S, big, v));
            expect(IllegalArgumentException.class, "v has " + (4 * N - 1) + " bytes remaining",
                    () -> pool.get(0, S, big, v));
            checkUnchanged(k, 4, 4 * N, "refused k");
            eq(0, pool.kvLen(id), "nothing written");
            ByteBuffer heap = ByteBuffer.allocate(4 * N).order(ByteOrder.nativeOrder());
            expect(IllegalArgumentException.class, "not a heap buffer", () -> pool.getPadded(0, S, heap, big));
        }
    }
}
