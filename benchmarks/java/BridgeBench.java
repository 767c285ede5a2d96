import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

import smile.llm.ChatCompletion;
import smile.llm.GenerationListener;
import smile.llm.LanguageModel;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;

/**
 * The Java side of {@code benchmarks/java_bridge.py}: timing loops that call the Python-backed interfaces. Every
 * loop returns the nanoseconds its {@code n} calls took, measured here with {@link System#nanoTime()}, so the
 * Python -> Java call that starts the loop is not counted.
 */
public final class BridgeBench {
    /** Results folded into a volatile field so the JIT cannot drop the calls. */
    private static volatile long sink;

    /** A JVM-created thread that makes calls as it is (a fresh Python thread state on every call). */
    private static final ExecutorService UNPINNED = Executors.newSingleThreadExecutor(daemon("bench-unpinned"));
    /** A JVM-created thread that called {@link Bridge#pinCurrentThread()} once, when it started. */
    private static final ExecutorService PINNED = Executors.newSingleThreadExecutor(daemon("bench-pinned"));
    private static volatile boolean pinnedReady;

    private static long lastGenerateNanos;
    private static long lastStreamedChars;

    private BridgeBench() {}

    private static java.util.concurrent.ThreadFactory daemon(String name) {
        return r -> {
            Thread t = new Thread(r, name);
            t.setDaemon(true);  // never delays interpreter exit
            return t;
        };
    }

    // ------------------------------------------------------------------------------------------ (a) trivial calls
    public static long freePages(KvCachePool pool, int n) {
        long acc = 0;
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) acc += pool.freePages();
        long dt = System.nanoTime() - t0;
        sink += acc;
        return dt;
    }

    public static long bindUnbind(KvCachePool pool, int[] prompt, int capacity, int n) {
        long acc = 0;
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) {
            int id = pool.bindRequest(prompt, capacity);
            pool.unbindRequest(id);
            acc += id;
        }
        long dt = System.nanoTime() - t0;
        sink += acc;
        return dt;
    }

    // ------------------------------------------------------------------------------------------ (b) threads
    /** {@link #freePages} run on a JVM-created worker thread, pinned or not; the caller waits for it. */
    public static long freePagesOnJavaThread(KvCachePool pool, int n, boolean pinned)
            throws InterruptedException, ExecutionException {
        ExecutorService worker = pinned ? PINNED : UNPINNED;
        if (pinned && !pinnedReady) {
            worker.submit(Bridge::pinCurrentThread).get();
            pinnedReady = true;
        }
        Future<Long> f = worker.submit(() -> freePages(pool, n));
        return f.get();
    }

    /** The name of the thread the worker runs on (to show it is not a Python-created thread). */
    public static String workerThreadName(boolean pinned) throws InterruptedException, ExecutionException {
        return (pinned ? PINNED : UNPINNED).submit(() -> Thread.currentThread().getName()).get();
    }

    // ------------------------------------------------------------------------------------------ (c) K/V buffers
    public static ByteBuffer direct(int bytes) {
        return ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
    }

    public static long put(KvCachePool pool, int layer, int start, int seqLen, ByteBuffer k, ByteBuffer v, int n) {
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) pool.put(layer, start, seqLen, k, v);
        return System.nanoTime() - t0;
    }

    public static long get(KvCachePool pool, int layer, int length, ByteBuffer k, ByteBuffer v, int n) {
        long t0 = System.nanoTime();
        for (int i = 0; i < n; i++) pool.get(layer, length, k, v);
        return System.nanoTime() - t0;
    }

    // ------------------------------------------------------------------------------------------ (d) generate
    /** One greedy generation from {@link Bridge#languageModel()}; its time is {@link #lastGenerateNanos()}. */
    public static ChatCompletion generate(int[] prompt, int maxGenLen, boolean withListener) {
        LanguageModel lm = Bridge.languageModel();
        long[] chunks = {0};
        GenerationListener listener = !withListener ? null : new GenerationListener() {
            @Override public void onText(String chunk) { chunks[0] += chunk.length(); }
        };
        long t0 = System.nanoTime();
        ChatCompletion c = lm.generate(prompt, maxGenLen, 0.0, 1.0, false, 0L, listener);
        lastGenerateNanos = System.nanoTime() - t0;
        lastStreamedChars = chunks[0];
        return c;
    }

    public static long lastGenerateNanos() {
        return lastGenerateNanos;
    }

    /** Characters the last generation's listener received through {@code onText}. */
    public static long lastStreamedChars() {
        return lastStreamedChars;
    }
}
