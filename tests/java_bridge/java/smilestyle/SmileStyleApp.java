package smilestyle;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import smile.deep.tensor.Device;
import smile.deep.tensor.ScalarType;
import smile.deep.tensor.Tensor;
import smile.llm.cache.FlashInferKvMetadata;
import smile.llm.cache.InsertResult;
import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;
import smile.llm.cache.MatchResult;
import smile.llm.cache.RadixCache;

/**
 * A JVM application written against Smile's own {@code smile.llm.cache} and {@code smile.deep.tensor} names only
 * (no {@code smile.llm.python.Bridge}, no test helpers), compiled against the bridge jar alone and run with
 * {@code python -m java_bridge --classpath <dir> --main smilestyle.SmileStyleApp --no-model}.
 *
 * <p>Where Smile takes or returns a {@code Tensor} the bridge cannot carry, this program uses the bridge's forms:
 * K/V for {@code put}/{@code get} are direct native-order {@code ByteBuffer}s (with an extra {@code seqLen}
 * argument to {@code put}). Slot ids are int64 host tensors as in Smile ({@code MatchResult.indices()},
 * {@code insert}'s {@code kvIndices}, {@code evict}'s callback). Everything else is Smile's spelling, the FlashInfer CSR
 * ({@code FlashInferKvMetadata} of host tensors) and {@code new KvCachePool(...)} included. It checks its own
 * results and exits with status 1 (after printing what differed) on failure.
 */
public final class SmileStyleApp {
    private static final List<String> failures = new ArrayList<>();

    private SmileStyleApp() {}

    private static void expect(boolean ok, String what) {
        if (!ok) failures.add(what);
    }

    private static void expectEq(Object want, Object got, String what) {
        if (!want.equals(got)) failures.add(what + ": expected " + want + ", got " + got);
    }

    private static ByteBuffer floats(int n, float value) {
        ByteBuffer b = ByteBuffer.allocateDirect(n * 4).order(ByteOrder.nativeOrder());
        for (int i = 0; i < n; i++) b.putFloat(i * 4, value);
        return b;
    }

    public static void main(String[] args) {
        KvCacheLayout layout = KvCacheLayout.of(2, 64, 4, 2, 1, 64); // headDim 16, 2 KV heads
        expectEq(16, layout.headDim(), "headDim");
        expectEq(16, KvCachePool.DEFAULT_PAGE_SIZE, "DEFAULT_PAGE_SIZE");

        try (KvCachePool pool = KvCachePool.forTesting(layout, Device.CPU())) {
            expectEq(64, pool.numSlots(), "numSlots");
            expectEq(1.0f, pool.kScale(), "kScale");
            expectEq(1.0f, pool.vScale(), "vScale");
            expectEq(ScalarType.Float, pool.computeDtype(), "computeDtype");
            expect(pool.kvIsComputeDtype(), "kvIsComputeDtype");
            expect(pool.device().isCPU(), "device");

            // a prompt, its KV, a speculative window, then finish it into the prefix tree
            int[] prompt = {10, 20, 30, 40, 50, 60, 70, 80};
            expectEq(0, pool.bindWithPrefix(prompt, 32), "first bind misses");
            int n = prompt.length * layout.numKvHeads() * layout.headDim();
            for (int layer = 0; layer < layout.numLayers(); layer++) {
                pool.put(layer, 0, prompt.length, floats(n, 1f), floats(n, 3f));
            }
            FlashInferKvMetadata meta = pool.sharedFlashInferMetadata(prompt.length);
            expectEq("[0, 8]", Arrays.toString(meta.pagedKvIndptr().intArray()), "indptr");
            expect(meta == pool.sharedFlashInferMetadata(prompt.length), "the step CSR is the same object");
            expect(pool.truncateTo(8, 8), "truncateTo keeps the CSR");
            pool.sealLength(8);
            pool.clearStepFlashInferMetadata();
            pool.finishRequest(prompt);
            expectEq(8, pool.radix().totalSize(), "the tree holds the prompt");

            // the pool's tree answers Smile's matchPrefix
            try (MatchResult m = pool.radix().matchPrefix(prompt)) {
                expectEq(8, m.length(), "matchPrefix(...).length()");
            }
            expectEq(7, pool.bindWithPrefix(prompt, 32), "second bind hits (capped below the last token)");
            ByteBuffer k = ByteBuffer.allocateDirect(7 * 32 * 4).order(ByteOrder.nativeOrder());
            ByteBuffer v = ByteBuffer.allocateDirect(7 * 32 * 4).order(ByteOrder.nativeOrder());
            pool.get(0, 7, k, v);
            expectEq(3.0f, v.getFloat(0), "V read through the prefix");
            pool.finishRequest(prompt);
        }

        // Smile's constructor
        try (KvCachePool pool = new KvCachePool(1, 64, 2, 16, 16, Device.CPU(), ScalarType.Float)) {
            expectEq(4, pool.freePages(), "new KvCachePool(...): 64 slots in pages of 16");
        }

        // a standalone tree, as Smile's RadixCacheTest uses one
        RadixCache cache = new RadixCache(1);
        InsertResult first = cache.insert(new int[] {1, 2, 3}, Tensor.of(new long[] {100, 101, 102}));
        expectEq(0, first.prefixLen(), "prefixLen");
        InsertResult second = cache.insert(new int[] {1, 2, 4}, Tensor.of(new long[] {200, 201, 202}));
        expectEq(2, second.prefixLen(), "shared prefix");
        MatchResult m = cache.matchPrefix(new int[] {1, 2, 3, 9});
        expectEq(3, m.length(), "match");
        cache.incLockRef(m.lastNode());
        expectEq(3, cache.protectedSize(), "protectedSize");
        List<Long> freed = new ArrayList<>();
        int evicted = cache.evict(10, slots -> { for (long s : slots.longArray()) freed.add(s); });
        expectEq(1, evicted, "only the unlocked leaf goes");
        expectEq(List.of(202L), freed, "freed slots");
        cache.decLockRef(m.lastNode());
        expectEq(3, cache.evictableSize(), "evictableSize");
        cache.reset();
        expectEq(0, cache.totalSize(), "reset");

        if (!failures.isEmpty()) {
            System.out.println("SmileStyleApp FAILED:");
            failures.forEach(f -> System.out.println("  " + f));
            System.exit(1);
        }
        System.out.println("SmileStyleApp OK");
    }
}
