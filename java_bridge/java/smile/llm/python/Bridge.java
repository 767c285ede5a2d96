package smile.llm.python;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import smile.deep.tensor.Device;
import smile.deep.tensor.DeviceRuntime;
import smile.deep.tensor.ScalarType;
import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;
import smile.llm.cache.RadixCache;

/**
 * The registry through which a JVM application obtains the Python-backed implementations. The launcher
 * ({@code python -m java_bridge --classpath app.jar --main com.example.App}) registers them before calling the
 * application's {@code main}.
 */
public final class Bridge {
    private static final Map<String, Object> REGISTRY = new ConcurrentHashMap<>();
    private static volatile Factory factory;

    /** Creates Python-backed objects on request (registered by the launcher). */
    public interface Factory extends DeviceRuntime.Backend {
        KvCachePool newKvCachePool(int numLayers, int numSlots, int numKvHeads, int headDim, int pageSize,
                                   String dtype);
        /** Smile's {@code new KvCachePool(...)}: a Python pool on {@code device} (torch's device string). */
        KvCachePool.Backend newKvCachePoolBackend(int numLayers, int numSlots, int numKvHeads, int headDim,
                                                  int pageSize, String device, String dtype);
        /** Python's {@code compute_static_kv_budget}: the seven fields of {@code KvCachePool.StaticKvBudget}. */
        long[] computeStaticKvBudget(long total, long free, double memFraction, long bytesPerToken, int pageSize,
                                     int maxBatchSize, int maxSeqLen);
        /** Python's {@code slots_from_budget}: {@code numSlots} and {@code maxUsefulSlots}. */
        int[] slotsFromBudget(long kvBudgetBytes, long bytesPerToken, int pageSize, int maxBatchSize,
                              int maxSeqLen);
        KvCachePool forTesting(int numLayers, int numKvHeads, int headDim, int maxBatchSize, int maxSeqLen);
        /** Python's {@code KvCachePool.for_testing(layout, device)}; {@code device} is torch's device string. */
        KvCachePool forTestingOn(KvCacheLayout layout, String device);
        /** Python's {@code KvCachePool.allocate}; {@code dtype} is torch's dtype name (for example "bfloat16"). */
        KvCachePool allocate(KvCacheLayout layout, String device, String dtype, double memFraction, int pageSize);
        /** Python's {@code KvCachePool.for_mtp}. */
        KvCachePool forMtp(KvCacheLayout layout, String device, String dtype, int pageSize);
        /** Python's {@code KvCachePool.for_mtp_history}. */
        KvCachePool forMtpHistory(KvCacheLayout layout, String device, String dtype, int pageSize, int wantSlots);
        /** A new standalone Python {@code RadixCache(pageSize)}. */
        RadixCache.Backend newRadixCache(int pageSize);
        /** {@code Device.emptyCache()} off the CPU: torch's {@code empty_cache()} for {@code device}. */
        @Override
        void emptyCache(String device);
    }

    private Bridge() {}

    public static void register(String name, Object implementation) {
        REGISTRY.put(name, implementation);
    }

    /** Registers {@code f}, which also serves the device calls ({@code Device.emptyCache()}). */
    public static void registerFactory(Factory f) {
        factory = f;
        DeviceRuntime.install(f);
    }

    /** The object registered under {@code name}. */
    public static <T> T get(String name, Class<T> type) {
        Object o = REGISTRY.get(name);
        if (o == null) {
            throw new IllegalStateException("no Python implementation registered as '" + name + "': start the "
                    + "application with the launcher, python -m java_bridge --classpath <app.jar> --main <class>"
                    + " (registered: " + REGISTRY.keySet() + ")");
        }
        return type.cast(o);
    }

    /**
     * The default language model (the launcher's --model, or the embedded default model): Smile's
     * {@link smile.llm.LanguageModel} with the bridge's additions.
     */
    public static PythonLanguageModel languageModel() {
        return get("model", PythonLanguageModel.class);
    }

    /**
     * Keep a Python thread state for the calling (Java-created) thread, so its calls into Python cost about 1 us
     * instead of about 10 us. Call it once at the start of each thread of a fixed worker pool; it leaks one thread
     * state per thread, so never call it from threads created per task.
     */
    public static void pinCurrentThread() {
        get("pinCurrentThread", Runnable.class).run();
    }

    /** A new Python-backed pool. */
    public static KvCachePool newKvCachePool(int numLayers, int numSlots, int numKvHeads, int headDim, int pageSize,
                                             String dtype) {
        return factory().newKvCachePool(numLayers, numSlots, numKvHeads, headDim, pageSize, dtype);
    }

    /** The Python pool behind Smile's {@code new KvCachePool(numLayers, ..., device, dtype)}. */
    public static KvCachePool.Backend kvCachePoolBackend(int numLayers, int numSlots, int numKvHeads, int headDim,
                                                         int pageSize, Device device, ScalarType dtype) {
        return factory().newKvCachePoolBackend(numLayers, numSlots, numKvHeads, headDim, pageSize,
                notNull(device, "device").toString(), notNull(dtype, "dtype").torchName());
    }

    /** Smile's {@code KvCachePool.slotsFromBudget}, computed by Python's {@code slots_from_budget}. */
    public static int[] slotsFromBudget(long kvBudgetBytes, long bytesPerToken, int pageSize, int maxBatchSize,
                                        int maxSeqLen) {
        return factory().slotsFromBudget(kvBudgetBytes, bytesPerToken, pageSize, maxBatchSize, maxSeqLen);
    }

    /** Smile's {@code KvCachePool.computeStaticKvBudget}, computed by Python's {@code compute_static_kv_budget}. */
    public static long[] computeStaticKvBudget(long total, long free, double memFraction, long bytesPerToken,
                                               int pageSize, int maxBatchSize, int maxSeqLen) {
        return factory().computeStaticKvBudget(total, free, memFraction, bytesPerToken, pageSize, maxBatchSize,
                maxSeqLen);
    }

    /** Smile's {@code KvCachePool.forTesting(layout)}: page size 1, float32, maxBatchSize * maxSeqLen slots. */
    public static KvCachePool forTesting(KvCacheLayout layout) {
        notNull(layout, "layout");
        return factory().forTesting(layout.numLayers(), layout.numKvHeads(), layout.headDim(),
                layout.maxBatchSize(), layout.maxSeqLen());
    }

    /** Smile's {@code KvCachePool.forTesting(layout, device)}: page size 1, float32, maxBatchSize * maxSeqLen slots. */
    public static KvCachePool forTesting(KvCacheLayout layout, Device device) {
        return factory().forTestingOn(notNull(layout, "layout"), notNull(device, "device").toString());
    }

    /** Smile's {@code KvCachePool.allocate(layout, device, dtype, memFraction, pageSize)}. */
    public static KvCachePool allocate(KvCacheLayout layout, Device device, ScalarType dtype, double memFraction,
                                       int pageSize) {
        return factory().allocate(notNull(layout, "layout"), notNull(device, "device").toString(),
                notNull(dtype, "dtype").torchName(), memFraction, pageSize);
    }

    /** Smile's {@code KvCachePool.forMtp(layout, device, dtype, pageSize)}. */
    public static KvCachePool forMtp(KvCacheLayout layout, Device device, ScalarType dtype, int pageSize) {
        return factory().forMtp(notNull(layout, "layout"), notNull(device, "device").toString(),
                notNull(dtype, "dtype").torchName(), pageSize);
    }

    /** Smile's {@code KvCachePool.forMtpHistory(layout, device, dtype, pageSize, wantSlots)}. */
    public static KvCachePool forMtpHistory(KvCacheLayout layout, Device device, ScalarType dtype, int pageSize,
                                            int wantSlots) {
        return factory().forMtpHistory(notNull(layout, "layout"), notNull(device, "device").toString(),
                notNull(dtype, "dtype").torchName(), pageSize, wantSlots);
    }

    /** The Python tree behind {@code new RadixCache(pageSize)}. */
    public static RadixCache.Backend newRadixCache(int pageSize) {
        return factory().newRadixCache(pageSize);
    }

    private static <T> T notNull(T value, String what) {
        if (value == null) throw new IllegalArgumentException(what + " must not be null");
        return value;
    }

    private static Factory factory() {
        Factory f = factory;
        if (f == null) {
            throw new IllegalStateException("the Python bridge is not running: start the application with "
                    + "python -m java_bridge --classpath <app.jar> --main <class>");
        }
        return f;
    }
}
