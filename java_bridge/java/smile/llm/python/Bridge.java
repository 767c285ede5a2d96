package smile.llm.python;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import smile.llm.LanguageModel;
import smile.llm.cache.KvCachePool;

/**
 * The registry through which a JVM application obtains the Python-backed implementations. The launcher
 * ({@code python -m java_bridge --classpath app.jar --main com.example.App}) registers them before calling the
 * application's {@code main}.
 */
public final class Bridge {
    private static final Map<String, Object> REGISTRY = new ConcurrentHashMap<>();
    private static volatile Factory factory;

    /** Creates Python-backed objects on request (registered by the launcher). */
    public interface Factory {
        KvCachePool newKvCachePool(int numLayers, int numSlots, int numKvHeads, int headDim, int pageSize,
                                   String dtype);
        KvCachePool forTesting(int numLayers, int numKvHeads, int headDim, int maxBatchSize, int maxSeqLen);
    }

    private Bridge() {}

    public static void register(String name, Object implementation) {
        REGISTRY.put(name, implementation);
    }

    public static void registerFactory(Factory f) {
        factory = f;
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

    /** The default language model (the launcher's --model, or the embedded default model). */
    public static LanguageModel languageModel() {
        return get("model", LanguageModel.class);
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

    /** Smile's {@code KvCachePool.forTesting(layout)}: page size 1, float32, maxBatchSize * maxSeqLen slots. */
    public static KvCachePool forTesting(smile.llm.cache.KvCacheLayout layout) {
        return factory().forTesting(layout.numLayers(), layout.numKvHeads(), layout.headDim(),
                layout.maxBatchSize(), layout.maxSeqLen());
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
