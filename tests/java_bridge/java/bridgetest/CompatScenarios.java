package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.List;
import smile.deep.tensor.Device;
import smile.deep.tensor.DeviceType;
import smile.deep.tensor.ScalarType;
import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;

/**
 * Smile source compatibility of the pool side: the scalar forms of the step verbs against their array forms, the
 * static factories on {@code KvCachePool} and their sizes, {@code KvCacheLayout.of}, the {@code smile.deep.tensor}
 * value types, the accessors Smile has ({@code kScale}, {@code computeDtype}, {@code device}, ...),
 * {@code getPadded} and {@code slotIndices(int[], int)}. Pools are {@link Audited}.
 */
public final class CompatScenarios {
    static final int H = 2, D = 4;

    private CompatScenarios() {}

    /** The same step sequence with the scalar forms (scalar = true) or the array forms; returns its trace. */
    static String stepTrace(boolean scalar) {
        try (KvCachePool pool = Audited.pool(1, 128, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int a = pool.bindRequest(new int[] {1}, 64), b = pool.bindRequest(new int[] {2}, 64);
            pool.activateStep(a, b);
            Kv.putConst(pool, 0, 0, 40, 1f, 2f);
            StringBuilder t = new StringBuilder();
            int[][] shared = Kv.csr(scalar ? pool.sharedFlashInferMetadata(40)
                    : pool.sharedFlashInferMetadata(new int[] {40, 40}));
            t.append("shared(40)=").append(Arrays.deepToString(shared));
            int[][] built = Kv.csr(scalar ? pool.buildFlashInferMetadata(33)
                    : pool.buildFlashInferMetadata(new int[] {33, 33}));
            t.append(" built(33)=").append(Arrays.deepToString(built));
            boolean bumped = scalar ? pool.truncateTo(36, 40) : pool.truncateTo(new int[] {36, 36}, new int[] {40, 40});
            t.append(" truncateTo(36,40)=").append(bumped).append(" kvLen=").append(pool.kvLen(a)).append(',')
                    .append(pool.kvLen(b));
            if (scalar) pool.invalidateRange(30, 36);
            else pool.invalidateRange(new int[] {30, 30}, new int[] {36, 36});
            ByteBuffer[] kv = Kv.get(pool, 0, 40);
            t.append(" invalidateRange(30,36): kvLen=").append(pool.kvLen(a)).append(',').append(pool.kvLen(b))
                    .append(" K[1,29]=").append(Kv.at(kv[0], 40, H, D, 1, 29, 1, 3))
                    .append(" K[1,30]=").append(Kv.at(kv[0], 40, H, D, 1, 30, 0, 0))
                    .append(" V[0,35]=").append(Kv.at(kv[1], 40, H, D, 0, 35, 1, 3))
                    .append(" V[0,36]=").append(Kv.at(kv[1], 40, H, D, 0, 36, 0, 0));
            boolean kept = scalar ? pool.sealLength(20) : pool.sealLength(new int[] {20, 20});
            t.append(" sealLength(20)=").append(kept).append(" kvLen=").append(pool.kvLen(a));
            if (scalar) pool.clearStepFlashInferMetadata();
            else pool.clearStepMetadata();
            t.append(" shared(20)=")
                    .append(Arrays.deepToString(Kv.csr(pool.sharedFlashInferMetadata(new int[] {20, 20}))));
            expect(IllegalArgumentException.class, "exceeds", () -> {
                if (scalar) pool.sealLength(65);
                else pool.sealLength(new int[] {65, 65});
            });
            eq(20, pool.kvLen(b), "a refused seal changes nothing");
            return t.toString();
        }
    }

    @Scenario
    public static void scalarFormsWhenSameValuesThenSameResultsAsArrayForms(List<String> log) {
        String scalar = stepTrace(true), array = stepTrace(false);
        log.add(scalar);
        eq(array, scalar, "scalar forms against array forms");
        // pages are handed out in order: row a holds pages 0-3, row b pages 4-7
        eq("shared(40)=[[0, 3, 6], [0, 1, 2, 4, 5, 6], [8, 8]] built(33)=[[0, 3, 6], [0, 1, 2, 4, 5, 6], [1, 1]]"
                + " truncateTo(36,40)=true kvLen=36,36 invalidateRange(30,36): kvLen=30,30 K[1,29]=1.0 K[1,30]=0.0"
                + " V[0,35]=0.0 V[0,36]=2.0 sealLength(20)=false kvLen=20"
                + " shared(20)=[[0, 2, 4], [0, 1, 4, 5], [4, 4]]", scalar, "trace");
    }

    @Scenario
    public static void staticFactoriesWhenCpuThenDocumentedSizes(List<String> log) {
        eq(16, KvCachePool.DEFAULT_PAGE_SIZE, "DEFAULT_PAGE_SIZE");
        KvCacheLayout tiny = KvCacheLayout.of(2, 64, 4, 2, 2, 50); // headDim 16, 2 KV heads
        try (KvCachePool pool = Audited.wrap(KvCachePool.forTesting(tiny, Device.CPU()))) {
            eq(100, pool.numSlots(), "forTesting: maxBatch * maxSeq slots");
            eq(1, pool.pageSize(), "forTesting page size");
            eq("torch.float32", pool.dtype(), "forTesting dtype");
            eq(2, pool.numLayers(), "layers");
            eq(2, pool.numKvHeads(), "kv heads");
            eq(16, pool.headDim(), "head dim");
            check(pool.isPrefixReuseEnabled(), "reuse on");
        }
        try (KvCachePool pool = Audited.wrap(KvCachePool.forTesting(tiny))) {
            eq(100, pool.numSlots(), "forTesting(layout)");
            eq(Device.CPU(), pool.device(), "forTesting(layout) is on the CPU");
        }
        try (KvCachePool pool = Audited.wrap(KvCachePool.allocate(tiny, Device.CPU(), ScalarType.Float, 0.85))) {
            eq(96, pool.numSlots(), "allocate on the CPU: floor_page(2 * 50, 16)");
            eq(KvCachePool.DEFAULT_PAGE_SIZE, pool.pageSize(), "allocate's default page size");
            eq(6, pool.freePages(), "pages");
        }
        try (KvCachePool pool = Audited.wrap(KvCachePool.allocate(tiny, Device.CPU(), ScalarType.BFloat16, 1.0, 4))) {
            eq(100, pool.numSlots(), "allocate, page size 4");
            eq("torch.bfloat16", pool.dtype(), "bfloat16 storage");
            eq(ScalarType.BFloat16, pool.computeDtype(), "computeDtype");
            check(pool.kvIsComputeDtype(), "bfloat16 is its own compute dtype");
        }
        KvCacheLayout mtp = KvCacheLayout.of(1, 64, 4, 2, 3, 9);
        try (KvCachePool pool = Audited.wrap(KvCachePool.forMtp(mtp, Device.CPU(), ScalarType.Half, 16))) {
            eq(48, pool.numSlots(), "forMtp: maxBatch * ceil_page(maxSeq)");
            eq(16, pool.pageSize(), "forMtp page size");
            eq("torch.float16", pool.dtype(), "forMtp dtype");
            check(pool.isPrefixReuseEnabled(), "forMtp keeps reuse on");
        }
        try (KvCachePool pool = Audited.wrap(KvCachePool.forMtpHistory(mtp, Device.CPU(), ScalarType.Float32, 16,
                100))) {
            eq(96, pool.numSlots(), "forMtpHistory: floor_page(wantSlots)");
            check(!pool.isPrefixReuseEnabled(), "forMtpHistory turns reuse off");
        }
        log.add(expect(IllegalStateException.class, "not enough free memory",
                () -> KvCachePool.forMtpHistory(mtp, Device.CPU(), ScalarType.Float, 16, 15)).getMessage());
        expect(IllegalArgumentException.class, "mem_fraction must be in (0, 1]",
                () -> KvCachePool.allocate(tiny, Device.CPU(), ScalarType.Float, 0.0));
        expect(IllegalArgumentException.class, "dtype must be one of",
                () -> KvCachePool.allocate(tiny, Device.CPU(), ScalarType.Int32, 0.5));
        expect(IllegalArgumentException.class, "page_size",
                () -> KvCachePool.allocate(tiny, Device.CPU(), ScalarType.Float, 0.5, 0));
        expect(IllegalArgumentException.class, "layout must not be null",
                () -> KvCachePool.forTesting(null, Device.CPU()));
        expect(IllegalArgumentException.class, "device must not be null", () -> KvCachePool.forTesting(tiny, null));
        expect(IllegalArgumentException.class, "dtype must not be null",
                () -> KvCachePool.forMtp(tiny, Device.CPU(), null, 16));
    }

    @Scenario
    public static void accessorsWhenFloatPoolThenSmileValues(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 32, H, D, 16)) {
            eq(1.0, pool.kScale(), "kScale");
            eq(1.0, pool.vScale(), "vScale");
            eq(ScalarType.Float, pool.computeDtype(), "computeDtype");
            check(pool.computeDtype() == ScalarType.Float32, "Float32 is Smile's older name of Float");
            check(pool.kvIsComputeDtype(), "kvIsComputeDtype");
            Device d = pool.device();
            eq(Device.CPU(), d, "device");
            eq(DeviceType.CPU, d.type(), "device type");
            eq(0, d.index(), "device index");
            check(d.isCPU() && !d.isCUDA() && !d.isMPS(), "isCPU");
            check(pool.radix() == pool.radixCache(), "radix() and radixCache() are the same tree");
            check(pool.radix() == pool.radix(), "the same object every call");
        }
    }

    @Scenario
    public static void layoutOfWhenDenseDimsThenHeadDimDerived(List<String> log) {
        eq(new KvCacheLayout(4, 2, 16, 1, 32), KvCacheLayout.of(4, 64, 4, 2, 1, 32), "of(4, 64, 4, 2, 1, 32)");
        eq(new KvCacheLayout(4, 4, 16, 2, 8), KvCacheLayout.of(4, 64, 4, null, 2, 8), "null KV heads: numHeads");
        log.add(expect(IllegalArgumentException.class, "not divisible",
                () -> KvCacheLayout.of(2, 100, 3, null, 1, 8)).getMessage());
        expect(IllegalArgumentException.class, "numHeads must be >= 1", () -> KvCacheLayout.of(2, 64, 0, 1, 1, 8));
        expect(IllegalArgumentException.class, ">= 1", () -> KvCacheLayout.of(2, 64, 4, 0, 1, 8));
    }

    @Scenario
    public static void deviceAndScalarTypeWhenCreatedThenTorchNames(List<String> log) {
        eq("cpu", Device.CPU().toString(), "CPU");
        eq("cuda:0", Device.CUDA().toString(), "CUDA()");
        eq("cuda:1", Device.CUDA((byte) 1).toString(), "CUDA(1)");
        eq("cuda", new Device(DeviceType.CUDA).toString(), "the current CUDA device");
        eq(-1, new Device(DeviceType.CUDA).index(), "default CUDA index");
        eq("mps", Device.MPS().toString(), "MPS");
        check(Device.CUDA((byte) 1).isCUDA(), "isCUDA");
        eq(Device.CUDA(), Device.CUDA((byte) 0), "equal by value");
        check(!Device.CUDA().equals(Device.CUDA((byte) 1)), "index matters");
        eq(1, DeviceType.CUDA.value(), "torch's CUDA code");
        expect(IllegalArgumentException.class, "CPU device index", () -> new Device(DeviceType.CPU, (byte) 1));
        eq("float32", ScalarType.Float.torchName(), "Float");
        eq("bfloat16", ScalarType.BFloat16.torchName(), "BFloat16");
        eq("float8_e4m3fn", ScalarType.Float8e4m3fn.torchName(), "Float8e4m3fn");
        eq(ScalarType.Half, ScalarType.Float16, "Float16 alias");
        eq(ScalarType.Double, ScalarType.ofTorchName("torch.float64"), "ofTorchName");
        expect(IllegalArgumentException.class, "no ScalarType", () -> ScalarType.ofTorchName("float4_e2m1fn_x2"));
    }

    @Scenario
    public static void getPaddedWhenRowsOfDifferentCapacityThenLastSlotRepeats(List<String> log) {
        try (KvCachePool pool = Audited.pool(1, 64, H, D, 16)) {
            pool.setPrefixReuseEnabled(false);
            int a = pool.bindRequest(new int[] {1}, 16), b = pool.bindRequest(new int[] {2}, 32);
            pool.activateStep(a, b);
            int[] zero = {0, 0};
            pool.put(0, zero, 16, Kv.pattern(zero, 16, H, D, false), Kv.pattern(zero, 16, H, D, true));
            pool.activateStep(b);
            int[] sixteen = {16};
            pool.put(0, sixteen, 16, Kv.pattern(sixteen, 16, H, D, false), Kv.pattern(sixteen, 16, H, D, true));
            pool.activateStep(a, b);
            int n = 2 * 32 * H * D;
            ByteBuffer k = Kv.floats(n), v = Kv.floats(n);
            pool.getPadded(0, 32, k, v);
            Kv.checkPattern(k, 32, H, D, 0, 0, 0, 16, false, "row a K");
            Kv.checkPattern(v, 32, H, D, 1, 1, 0, 16, true, "row b V, first page");
            Kv.checkPattern(k, 32, H, D, 1, 0, 16, 32, false, "row b K, second page (written as row 0)");
            for (int p = 16; p < 32; p++) {
                eq(Kv.value(0, 15, 1, 3, false), Kv.at(k, 32, H, D, 0, p, 1, 3), "row a past its capacity, K " + p);
                eq(Kv.value(0, 15, 0, 0, true), Kv.at(v, 32, H, D, 0, p, 0, 0), "row a past its capacity, V " + p);
            }
            expect(IllegalArgumentException.class, null, () -> pool.get(0, 32, k, v));
            long[] all = pool.slotIndices(16);
            eq(new long[] {all[3], all[4], all[16 + 5], all[16 + 6]}, pool.slotIndices(new int[] {3, 5}, 2),
                    "slotIndices(startPos, seqlen)");
            log.add("slots=" + Arrays.toString(all));
        }
    }
}
