package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.nio.ByteBuffer;
import java.util.List;
import smile.deep.tensor.Device;
import smile.deep.tensor.ScalarType;
import smile.deep.tensor.Tensor;
import smile.llm.cache.FlashInferKvMetadata;
import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;

/**
 * {@code KvCachePool} as Smile's class: its constructor, {@code computeStaticKvBudget}, {@code FlashInferKvMetadata}
 * and when the pool hands back the same one, the CUDA-graph and prefetch calls (on the CPU), and {@code truncateTo}
 * zeroing the rejected tail. The cases of Smile's {@code KvCachePoolTest} and {@code FlashInferKvMetadataTest}
 * that concern these, in this bridge's terms. Pools are made with {@code new KvCachePool(...)} and {@link Audited}.
 */
public final class SmilePoolScenarios {
    static final int H = 2, D = 16;

    private SmilePoolScenarios() {}

    /** Smile's constructor (float32 on the CPU, {@code H} KV heads of {@code D}), audited. */
    static KvCachePool pool(int layers, int slots, int pageSize) {
        return Audited.wrap(new KvCachePool(layers, slots, H, D, pageSize, Device.CPU(), ScalarType.Float));
    }

    /** Returns its argument: lets Python hand an adapter to a {@code KvCachePool} parameter. */
    public static KvCachePool same(KvCachePool pool) {
        return pool;
    }

    static void same(Object expected, Object actual, String what) {
        check(expected == actual, what + ": expected the same object " + expected + ", got " + actual);
    }

    static int[] last(FlashInferKvMetadata m) {
        return m.pagedKvLastPageLen().intArray();
    }

    static int[] indptr(FlashInferKvMetadata m) {
        return m.pagedKvIndptr().intArray();
    }

    /** {@code rows * seq} positions of {@code value}. */
    static ByteBuffer fill(int rows, int seq, float value) {
        return Kv.fill(rows * seq * H * D, value);
    }

    @Scenario
    public static void constructorWhenSmileArgumentsThenPythonPool(List<String> log) {
        try (KvCachePool pool = pool(1, 64, 16)) {
            eq(64, pool.numSlots(), "numSlots");
            eq(16, pool.pageSize(), "pageSize");
            eq(4, pool.freePages(), "freePages");
            eq(1, pool.numLayers(), "numLayers");
            eq(H, pool.numKvHeads(), "numKvHeads");
            eq(D, pool.headDim(), "headDim");
            eq("torch.float32", pool.dtype(), "dtype");
            eq(ScalarType.Float, pool.computeDtype(), "computeDtype");
            eq(Device.CPU(), pool.device(), "device");
            // Smile: bound pages return to the free list
            pool.bindRequests(1, 32);
            eq(2, pool.freePages(), "two pages bound");
            pool.unbindRequests();
            eq(4, pool.freePages(), "all pages free again");
        }
        try (KvCachePool pool = Audited.wrap(new KvCachePool(2, 32, H, D, 8, Device.CPU(), ScalarType.BFloat16))) {
            eq("torch.bfloat16", pool.dtype(), "bfloat16 storage");
            eq(ScalarType.BFloat16, pool.computeDtype(), "its compute dtype");
            eq(4, pool.freePages(), "pages of 8");
        }
        // Smile: allocate on the CPU is sized to maxBatchSize * maxSeqLen, never more
        try (KvCachePool pool = KvCachePool.allocate(KvCacheLayout.of(2, 64, 4, 2, 2, 64), Device.CPU(),
                ScalarType.Float, 0.85)) {
            eq(128, pool.numSlots(), "2 * 64 slots");
            eq(0, pool.numSlots() % pool.pageSize(), "whole pages");
        }
        try (KvCachePool pool = KvCachePool.allocate(KvCacheLayout.of(1, 64, 4, 2, 1, 128), Device.CPU(),
                ScalarType.Float, 1.0)) {
            eq(128, pool.numSlots(), "not raised above maxBatchSize * maxSeqLen");
        }
        log.add(expect(IllegalArgumentException.class, "multiple of page_size",
                () -> new KvCachePool(1, 20, H, D, 16, Device.CPU(), ScalarType.Float)).getMessage());
        expect(IllegalArgumentException.class, "num_layers must be >= 1",
                () -> new KvCachePool(0, 16, H, D, 16, Device.CPU(), ScalarType.Float));
        expect(IllegalArgumentException.class, "device must not be null",
                () -> new KvCachePool(1, 16, H, D, 16, null, ScalarType.Float));
        expect(IllegalArgumentException.class, "dtype must not be null",
                () -> new KvCachePool(1, 16, H, D, 16, Device.CPU(), null));
        expect(IllegalArgumentException.class, "dtype must be one of",
                () -> new KvCachePool(1, 16, H, D, 16, Device.CPU(), ScalarType.Int32));
        expect(IllegalArgumentException.class, "backend must not be null", () -> new KvCachePool(null));
    }

    @Scenario
    public static void staticKvBudgetWhenSmileNumbersThenSglangRule(List<String> log) {
        // Smile: 40 GiB total, 10 GiB used, y = 0.85: static 34 GiB, KV 24 GiB less the soft margin
        long total = 40L << 30, used = 10L << 30;
        KvCachePool.StaticKvBudget b = KvCachePool.computeStaticKvBudget(total, total - used, 0.85, 1024L, 16, 1,
                8192);
        long staticBudget = (long) (total * 0.85);
        long softMargin = Math.min(1L << 30, Math.max(512L << 20, total / 40));
        eq(total, b.total(), "total");
        eq(used, b.used(), "used");
        eq(staticBudget, b.staticBudget(), "staticBudget");
        eq(staticBudget - used - softMargin, b.kvBudget(), "kvBudget");
        eq(total - staticBudget, b.dynamicReserve(), "dynamicReserve");
        eq(8192, b.maxUsefulSlots(), "maxUsefulSlots");
        eq(8192, b.numSlots(), "24 GiB buys far more than the context: capped");
        eq(b, KvCachePool.computeStaticKvBudget(total, total - used, 0.85, 1024L, 16, 1, 8192), "a value record");
        log.add(b.toString());
        // Smile: a tight budget drops the soft margin and buys fewer slots than the context
        long total2 = 20L << 30, used2 = (long) (total2 * 0.85) - (512L << 20);
        KvCachePool.StaticKvBudget tight = KvCachePool.computeStaticKvBudget(total2, total2 - used2, 0.85,
                2L * 32 * 8 * 128 * 2, 16, 1, 8192);
        check(tight.kvBudget() > 0, "kvBudget > 0");
        check(tight.numSlots() < tight.maxUsefulSlots(), "fewer slots than the context");
        eq(0, tight.numSlots() % 16, "whole pages");
        eq((long) (total2 * 0.85) - used2, tight.kvBudget(), "no soft margin");
        log.add(tight.toString());
        // Smile: used beyond the static budget
        log.add(expect(IllegalStateException.class, "KV static budget too small",
                () -> KvCachePool.computeStaticKvBudget(10L << 30, 1L << 30, 0.5, 1024L, 16, 1, 128)).getMessage());
        expect(IllegalArgumentException.class, "mem_fraction",
                () -> KvCachePool.computeStaticKvBudget(total, used, 0.0, 1024L, 16, 1, 128));
        expect(IllegalArgumentException.class, "free memory",
                () -> KvCachePool.computeStaticKvBudget(total, total + 1, 0.5, 1024L, 16, 1, 128));
        expect(IllegalArgumentException.class, "must be > 0",
                () -> KvCachePool.computeStaticKvBudget(0, 0, 0.5, 1024L, 16, 1, 128));
    }

    @Scenario
    public static void buildFlashInferMetadataWhenBoundThenFixedCsrOfThePages(List<String> log) {
        try (KvCachePool pool = Audited.wrap(new KvCachePool(1, 64, 2, 8, 16, Device.CPU(), ScalarType.Float))) {
            pool.bindRequests(1, 20);
            try (FlashInferKvMetadata meta = pool.buildFlashInferMetadata(20)) {
                // Smile's FlashInferKvMetadataTest
                eq(16, meta.pageSize(), "pageSize");
                eq(new long[] {2}, meta.pagedKvIndptr().shape(), "indptr shape: B + 1");
                eq(new int[] {0, 2}, indptr(meta), "ceil(20 / 16) = 2 pages");
                eq(2, meta.pagedKvIndices().length(), "indices");
                eq(new int[] {4}, last(meta), "20 % 16");
                eq(new int[] {0, 1}, meta.pagedKvIndices().intArray(), "a fresh pool hands out pages 0, 1");
                eq(ScalarType.Int32, meta.pagedKvIndices().dtype(), "int32");
                eq(Device.CPU(), meta.pagedKvIndptr().device(), "host tensors");
                check(!meta.isPoolOwned(), "a built CSR is the caller's, fixed");
                same(meta.pagedKvIndptr(), meta.pagedKvIndptr(), "a fixed CSR's tensor");
                check(meta != pool.buildFlashInferMetadata(20), "a new CSR every call");
                log.add(meta.toString());
            }
            eq(new int[] {0, 0}, indptr(pool.buildFlashInferMetadata(0)), "length 0: an empty row");
            eq(new int[] {0}, last(pool.buildFlashInferMetadata(0)), "its lastPageLen is 0");
            expect(IllegalArgumentException.class, null, () -> pool.buildFlashInferMetadata(33));
        }
        Tensor a = Tensor.of(new int[] {0, 1}), b = Tensor.of(new int[] {5}), c = Tensor.of(new int[] {3});
        FlashInferKvMetadata own = new FlashInferKvMetadata(a, b, c, 4);
        same(a, own.pagedKvIndptr(), "Smile's record constructor keeps the tensors");
        same(b, own.pagedKvIndices(), "indices");
        same(c, own.pagedKvLastPageLen(), "lastPageLen");
        eq(4, own.pageSize(), "pageSize");
    }

    @Scenario
    public static void sharedMetadataWhenStepUnchangedThenSameObjectElseNew(List<String> log) {
        try (KvCachePool pool = pool(1, 256, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id1 = pool.bindRequest(new int[] {1, 2, 3, 4}, 32);
            int id2 = pool.bindRequest(new int[] {5, 6, 7, 8}, 48);
            pool.activateStep(id1, id2);
            // Smile: the same cohort keeps its CSR, another cohort rebuilds it
            int[] lens = {10, 25};
            FlashInferKvMetadata first = pool.sharedFlashInferMetadata(lens);
            check(first.isPoolOwned(), "the step CSR is the pool's");
            same(first, pool.sharedFlashInferMetadata(lens), "unchanged lengths");
            same(first, pool.currentStepFlashInferMetadata(), "currentStepFlashInferMetadata");
            pool.activateStep(id1, id2);
            same(first, pool.sharedFlashInferMetadata(lens), "the same cohort activated again");
            eq(new int[] {0, 1, 3}, indptr(first), "indptr");
            eq(new int[] {10, 9}, last(first), "lastPageLen");
            pool.activateStep(id1);
            FlashInferKvMetadata single = pool.sharedFlashInferMetadata(10);
            check(single != first, "another cohort: a new CSR");
            // Smile: batch-1 decode inside a page bumps the CSR in place
            pool.activateStep(id1);
            same(single, pool.sharedFlashInferMetadata(11), "10 -> 11 inside a page");
            eq(new int[] {11}, last(single), "lastPageLen rewritten");
            Tensor indptr = single.pagedKvIndptr();
            same(single, pool.sharedFlashInferMetadata(16), "16 still fills one page");
            same(indptr, single.pagedKvIndptr(), "an unchanged part keeps its tensor");
            FlashInferKvMetadata twoPages = pool.sharedFlashInferMetadata(17);
            check(twoPages != single, "a page boundary crossed: a new CSR");
            eq(new int[] {0, 2}, indptr(twoPages), "two pages");
            eq(new int[] {16}, last(single), "the dropped CSR keeps its last values");
            pool.clearStepMetadata();
            check(pool.currentStepFlashInferMetadata() == null, "no step CSR after clear");
            check(pool.sharedFlashInferMetadata(17) != twoPages, "cleared: rebuilt");
            // Smile: a uniform batch grows inside a page in place
            pool.activateStep(id1, id2);
            FlashInferKvMetadata u10 = pool.sharedFlashInferMetadata(new int[] {10, 10});
            pool.activateStep(id1, id2);
            same(u10, pool.sharedFlashInferMetadata(new int[] {11, 11}), "uniform B > 1 inside a page");
            eq(new int[] {11, 11}, last(u10), "lastPageLen");
            pool.unbindRequest(id1);
            check(pool.currentStepFlashInferMetadata() == null, "unbinding an active row drops the step");
            pool.unbindRequest(id2);
        }
    }

    @Scenario
    public static void mtpRoundTripWhenSealAndRegrowInsideAPageThenSameTensors(List<String> log) {
        try (KvCachePool pool = pool(1, 64, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id = pool.bindRequests(1, 32)[0];
            Kv.putConst(pool, 0, 0, 14, 1f, 1f);
            FlashInferKvMetadata meta = pool.sharedFlashInferMetadata(10);
            Tensor indptr = meta.pagedKvIndptr(), indices = meta.pagedKvIndices();
            // verify window 10 -> 13, all accepted
            check(pool.truncateTo(13, 13), "kept in place");
            same(meta, pool.sharedFlashInferMetadata(13), "grow inside the page");
            same(indptr, meta.pagedKvIndptr(), "indptr tensor");
            same(indices, meta.pagedKvIndices(), "indices tensor");
            // next window 13 -> 16, one accepted
            check(pool.truncateTo(11, 16), "kept in place");
            eq(new int[] {11}, last(meta), "the held CSR reads the rewrite");
            same(meta, pool.sharedFlashInferMetadata(11), "shrink inside the page");
            same(indptr, meta.pagedKvIndptr(), "indptr tensor after the reject");
            same(indices, meta.pagedKvIndices(), "indices tensor after the reject");
            check(pool.truncateTo(14, 14), "kept in place");
            same(meta, pool.sharedFlashInferMetadata(14), "grow again");
            eq(new int[] {14}, last(meta), "lastPageLen");
            eq(11, pool.kvLen(id), "seals only lower kvLen");
            check(!pool.sealLength(17), "sealing into another page count rebuilds");
            check(pool.sharedFlashInferMetadata(17) != meta, "a new CSR");
        }
    }

    @Scenario
    public static void truncateToWhenZeroRejectedThenTailReadsZeros(List<String> log) {
        try (KvCachePool pool = pool(2, 64, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id = pool.bindRequests(1, 32)[0];
            for (int layer = 0; layer < 2; layer++) Kv.putConst(pool, layer, 0, 20, 1f, 3f);
            FlashInferKvMetadata full = pool.sharedFlashInferMetadata(20);
            eq(new int[] {4}, last(full), "20 % 16");
            check(!pool.zeroRejectedKv(), "zeroing is off by default");
            // Smile: accept through 17, reject 17..20, and the tail reads zeros
            check(pool.truncateTo(17, 20, true), "the page count is kept");
            same(full, pool.sharedFlashInferMetadata(17), "the same CSR, sealed");
            eq(new int[] {1}, last(full), "lastPageLen 1");
            eq(17, pool.kvLen(id), "kvLen sealed");
            check(!pool.zeroRejectedKv(), "the switch is as it was");
            for (int layer = 0; layer < 2; layer++) {
                ByteBuffer[] kv = Kv.get(pool, layer, 20);
                String at = "layer " + layer + " ";
                eq(1.0, Kv.at(kv[0], 20, H, D, 0, 16, 0, 0), at + "K[16] kept");
                eq(3.0, Kv.at(kv[1], 20, H, D, 0, 16, 1, 15), at + "V[16] kept");
                Kv.checkConst(kv[0], 20, H, D, 0, 17, 20, 0f, at + "K of the rejected tail");
                Kv.checkConst(kv[1], 20, H, D, 0, 17, 20, 0f, at + "V of the rejected tail");
            }
            // the two-argument form follows the switch; the boolean overrides it either way
            for (int layer = 0; layer < 2; layer++) Kv.putConst(pool, layer, 17, 3, 5f, 5f);
            pool.setZeroRejectedKv(true);
            check(pool.zeroRejectedKv(), "switch on");
            pool.truncateTo(18, 20, false);
            eq(5.0, Kv.at(Kv.get(pool, 0, 20)[0], 20, H, D, 0, 19, 0, 0), "false: the tail is kept");
            pool.truncateTo(18, 20);
            ByteBuffer[] kv = Kv.get(pool, 1, 20);
            eq(5.0, Kv.at(kv[0], 20, H, D, 0, 17, 0, 0), "K[17] accepted");
            Kv.checkConst(kv[0], 20, H, D, 0, 18, 20, 0f, "switch on: the tail is zeroed");
            pool.setZeroRejectedKv(false);
            log.add(expect(IllegalArgumentException.class, "writtenEnd must be >= sealedLen",
                    () -> pool.truncateTo(12, 11, true)).getMessage());
            check(!pool.zeroRejectedKv(), "a failed call leaves the switch as it was");
            eq(18, pool.kvLen(id), "and changes nothing");
            check(pool.truncateTo(new int[] {17}, new int[] {18}, true), "the array form");
            ByteBuffer[] kv2 = Kv.get(pool, 0, 20);
            eq(1.0, Kv.at(kv2[0], 20, H, D, 0, 16, 1, 15), "array form: K[16] accepted");
            Kv.checkConst(kv2[0], 20, H, D, 0, 17, 18, 0f, "array form: K[17] zeroed");
            eq(17, pool.kvLen(id), "kvLen");
        }
        // zeroing never reaches into the tree's pages
        try (KvCachePool pool = pool(1, 64, 1)) {
            int[] prompt = PoolScenarios.range(1, 9);
            int a = pool.bindRequest(prompt, 16);
            Kv.putConst(pool, 0, 0, 8, 1f, 1f);
            pool.finishRequest(a, prompt);
            int b = pool.bindRequest(prompt, 16);
            eq(7, pool.matchedPrefixLen(b), "matched below the last prompt token");
            Kv.putConst(pool, 0, 7, 3, 2f, 2f);
            log.add(expect(IllegalArgumentException.class, "matched prefix",
                    () -> pool.truncateTo(5, 10, true)).getMessage());
            eq(10, pool.kvLen(b), "nothing changed");
            pool.truncateTo(8, 10, true); // above the prefix
            ByteBuffer[] kv = Kv.get(pool, 0, 10);
            eq(1.0, Kv.at(kv[0], 10, H, D, 0, 6, 0, 0), "the prefix");
            eq(2.0, Kv.at(kv[0], 10, H, D, 0, 7, 0, 0), "accepted");
            Kv.checkConst(kv[0], 10, H, D, 0, 8, 10, 0f, "rejected");
            pool.unbindRequests();
        }
    }

    @Scenario
    public static void verifyGraphBuffersWhenPutThenSameSlotsAsTheFreshIndex(List<String> log) {
        try (KvCachePool pool = pool(1, 128, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id1 = pool.bindRequest(new int[] {1, 2, 3, 4}, 32);
            int id2 = pool.bindRequest(new int[] {5, 6, 7, 8}, 32);
            pool.activateStep(id1, id2);
            int w = 3;
            int[] start = {4, 4};
            expect(IllegalStateException.class, "not prepared", pool::verifyGraphMetadata);
            pool.put(0, start, w, fill(2, w, 1f), fill(2, w, 9f)); // the fresh-index path first
            ByteBuffer[] before = Kv.get(pool, 0, 7);
            eq(9.0, Kv.at(before[1], 7, H, D, 0, 6, 0, 0), "V[0,6]");
            eq(9.0, Kv.at(before[1], 7, H, D, 1, 4, 0, 0), "V[1,4]");
            // Smile: the same window through the fixed verify index lands on the same slots
            pool.activateStep(id1, id2);
            FlashInferKvMetadata g = pool.prepareVerifyGraphStep(7, start, w);
            check(g.isPoolOwned(), "the graph CSR is the pool's");
            same(g, pool.verifyGraphMetadata(), "verifyGraphMetadata");
            same(g, pool.decodeGraphMetadata(2), "one graph CSR for decode and verify graphs");
            eq(new int[] {0, 1, 2}, indptr(g), "indptr");
            eq(new int[] {7, 7}, last(g), "lastPageLen");
            long[] slots = pool.slotIndices(start, w);
            int[] pages = g.pagedKvIndices().intArray();
            eq(new int[] {(int) (slots[0] / 16), (int) (slots[w] / 16)}, new int[] {pages[0], pages[1]},
                    "the rows' pages lead the graph indices");
            check(pool.consumeVerifyGraphMetaRealloc(), "the first allocation is reported");
            check(!pool.consumeVerifyGraphMetaRealloc(), "once");
            eq(slots, pool.verifyGraphIndex(2, w).longArray(), "the fixed write index");
            eq(ScalarType.Int64, pool.verifyGraphIndex(2, w).dtype(), "int64");
            pool.setVerifyGraphBuffers(true);
            check(pool.verifyGraphBuffers(), "on");
            try {
                pool.put(0, start, w, fill(2, w, 1f), fill(2, w, 42f));
                expect(IllegalArgumentException.class, "prepared at",
                        () -> pool.put(0, new int[] {3, 3}, w, fill(2, w, 1f), fill(2, w, 7f)));
            } finally {
                pool.setVerifyGraphBuffers(false);
            }
            ByteBuffer[] after = Kv.get(pool, 0, 7);
            for (int row = 0; row < 2; row++) {
                Kv.checkConst(after[1], 7, H, D, row, 4, 7, 42f, "V of row " + row + " through the fixed index");
            }
            same(g, pool.prepareVerifyGraphStep(new int[] {7, 7}, start, w), "the per-row form, same CSR");
            // the query indptr: one fixed tensor per shape
            Tensor qo = pool.verifyQoIndptrBuf(2, w);
            eq(new int[] {0, 3, 6}, qo.intArray(), "[0, W, 2W]");
            same(qo, pool.verifyQoIndptrBuf(2, w), "the same tensor for the same shape");
            check(qo != pool.verifyQoIndptrBuf(1, w), "another shape, another tensor");
            expect(IllegalArgumentException.class, "batch", () -> pool.verifyQoIndptrBuf(0, w));
            pool.unbindRequest(id1);
            pool.unbindRequest(id2);
        }
        // Smile: verify buffers on without a prepared window fail loudly
        try (KvCachePool pool = pool(1, 64, 16)) {
            pool.setPrefixReuseEnabled(false);
            pool.bindRequests(1, 32);
            pool.setVerifyGraphBuffers(true);
            try {
                log.add(expect(IllegalStateException.class, "not prepared",
                        () -> pool.put(0, 0, 3, fill(1, 3, 1f), fill(1, 3, 1f))).getMessage());
            } finally {
                pool.setVerifyGraphBuffers(false);
            }
            check(!pool.verifyGraphBuffers(), "off");
        }
    }

    @Scenario
    public static void decodeGraphStepWhenPreparedThenFixedIndexAndGraphCsr(List<String> log) {
        try (KvCachePool pool = pool(1, 128, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id1 = pool.bindRequest(new int[] {1}, 32), id2 = pool.bindRequest(new int[] {2}, 32);
            pool.activateStep(id1, id2);
            pool.put(0, 0, 5, fill(2, 5, 1f), fill(2, 5, 2f));
            int[] pos = {5, 5};
            FlashInferKvMetadata g = pool.prepareDecodeGraphStep(6, pos);
            same(g, pool.decodeGraphMetadata(2), "decodeGraphMetadata");
            eq(new int[] {0, 1, 2}, indptr(g), "indptr");
            eq(new int[] {6, 6}, last(g), "lastPageLen");
            eq(6, pool.kvLen(id1), "a prepared decode step counts as written");
            check(pool.currentStepFlashInferMetadata() == null, "the step CSR is left alone");
            Tensor index = pool.decodeGraphIndex(2);
            eq(pool.slotIndices(pos, 1), index.longArray(), "the fixed write index");
            same(index, pool.decodeGraphIndex(2), "unchanged: the same tensor");
            pool.setDecodeGraphBuffers(true);
            check(pool.decodeGraphBuffers(), "on");
            try {
                pool.put(0, pos, 1, fill(2, 1, 5f), fill(2, 1, 6f));
                expect(IllegalArgumentException.class, "prepared for positions",
                        () -> pool.put(0, new int[] {4, 4}, 1, fill(2, 1, 0f), fill(2, 1, 0f)));
            } finally {
                pool.setDecodeGraphBuffers(false);
            }
            ByteBuffer[] kv = Kv.get(pool, 0, 6);
            for (int row = 0; row < 2; row++) {
                Kv.checkConst(kv[1], 6, H, D, row, 5, 6, 6f, "V[" + row + ",5] through the fixed index");
                Kv.checkConst(kv[1], 6, H, D, row, 0, 5, 2f, "V[" + row + ",0..5] untouched");
            }
            // the next step rewrites the same graph CSR and index in place
            same(g, pool.prepareDecodeGraphStep(7, new int[] {6, 6}), "the next decode step");
            eq(new int[] {7, 7}, last(g), "rewritten lastPageLen");
            check(index != pool.decodeGraphIndex(2), "a rewritten index: a new tensor");
            check(pool.sharedFlashInferMetadata(7) != g, "the step CSR is another CSR");
            // more rows move the graph CSR
            check(pool.consumeVerifyGraphMetaRealloc(), "the first allocation is reported");
            pool.reserveGraphRows(4);
            check(pool.consumeVerifyGraphMetaRealloc(), "growing moves it");
            check(pool.decodeGraphMetadata(2) != g, "moved: a new graph CSR");
            eq(new int[] {7, 7}, last(g), "the old one keeps its values");
            log.add(expect(IllegalStateException.class, "rows reserved", () -> pool.decodeGraphMetadata(5))
                    .getMessage());
            expect(IllegalStateException.class, "decode write index", () -> pool.decodeGraphIndex(3));
            pool.setVerifyWindowKernel(true);
            check(pool.verifyWindowKernel(), "verifyWindowKernel");
            pool.setVerifyWindowKernel(false);
        }
    }

    @Scenario
    public static void prefetchWhenCapturedThenScratchWritesAndInstall(List<String> log) {
        try (KvCachePool pool = pool(1, 128, 16)) {
            pool.setPrefixReuseEnabled(false);
            int id = pool.bindRequest(new int[] {1}, 64);
            Kv.putConst(pool, 0, 0, 10, 1f, 1f);
            FlashInferKvMetadata live = pool.sharedFlashInferMetadata(10);
            FlashInferKvMetadata pre = pool.beginPrefetchDecodeGraphStep(17, 16, 1);
            check(pre != live && pre.isPoolOwned(), "a CSR of its own");
            same(pre, pool.currentStepFlashInferMetadata(), "installed while the capture runs");
            eq(new int[] {0, 2}, indptr(pre), "17 tokens: two pages");
            eq(new int[] {1}, last(pre), "lastPageLen");
            log.add(expect(IllegalStateException.class, "prefetch", () -> pool.sealLength(10)).getMessage());
            pool.setDecodeGraphBuffers(true);
            try {
                pool.put(0, new int[] {16}, 1, fill(1, 1, 9f), fill(1, 1, 9f));
            } finally {
                pool.setDecodeGraphBuffers(false);
            }
            eq(10, pool.kvLen(id), "the capture wrote scratch slots, not the row");
            same(pre, pool.endPrefetchDecodeGraphStep(), "end returns the prefetch CSR");
            same(live, pool.currentStepFlashInferMetadata(), "the live step CSR is back");
            expect(IllegalStateException.class, "no prefetch", pool::endPrefetchDecodeGraphStep);
            pool.installPrefetchedStepMetadata(pre, 17);
            same(pre, pool.currentStepFlashInferMetadata(), "the prefetched CSR itself");
            same(pre, pool.sharedFlashInferMetadata(17), "and the step CSR for 17");
            // a fixed CSR of the same values installs as a pool-owned copy
            FlashInferKvMetadata built = pool.buildFlashInferMetadata(17);
            pool.installPrefetchedStepMetadata(built, 17);
            FlashInferKvMetadata installed = pool.currentStepFlashInferMetadata();
            check(installed != built && installed != pre && installed.isPoolOwned(), "a pool-owned copy");
            eq(java.util.Arrays.deepToString(Kv.csr(built)), java.util.Arrays.deepToString(Kv.csr(installed)),
                    "its values");
            expect(IllegalArgumentException.class, "does not describe",
                    () -> pool.installPrefetchedStepMetadata(built, 16));
            expect(IllegalArgumentException.class, "must not be null",
                    () -> pool.installPrefetchedStepMetadata(null, 17));
            same(installed, pool.currentStepFlashInferMetadata(), "a refused install changes nothing");
        }
    }
}
