package bridgetest;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import smile.llm.cache.KvCacheExhaustedException;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;

/**
 * Java threads hammering one pool with bindRequest / finishRequest / unbindRequest (the binding verbs are
 * atomic, so they run unsynchronised). Writing KV needs the active step, a sequence one thread must own: that
 * part (activateStep, put, kvLen) runs under a Java lock. Exhaustion is expected (the pool is small) and retried;
 * anything else fails the run. The driver joins its workers with a timeout, so a deadlock fails instead of hanging.
 */
public final class Hammer {
    private Hammer() {}

    static final int[][] HEADS = {{7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}, {1, 2, 3, 4, 5, 6, 7, 8},
            {9, 8, 7}};

    /** Returns counters; throws AssertionError on a worker failure, a stuck worker or a bad final state. */
    public static String[] run(KvCachePool pool, int threads, long millis, boolean pin, long joinTimeoutMs)
            throws InterruptedException {
        return run(pool, threads, millis, pin, joinTimeoutMs, true);
    }

    /** As above; {@code alone}: nobody else uses the pool, so nothing may stay bound at the end. */
    public static String[] run(KvCachePool pool, int threads, long millis, boolean pin, long joinTimeoutMs,
                               boolean alone) throws InterruptedException {
        AtomicLong binds = new AtomicLong(), finishes = new AtomicLong(), unbinds = new AtomicLong(),
                exhausted = new AtomicLong(), hits = new AtomicLong(), puts = new AtomicLong();
        ConcurrentLinkedQueue<Throwable> failures = new ConcurrentLinkedQueue<>();
        Object stepLock = new Object();
        CountDownLatch start = new CountDownLatch(1);
        long[] deadline = new long[1];
        List<Thread> workers = new ArrayList<>();
        int heads = pool.numKvHeads(), dim = pool.headDim();
        for (int t = 0; t < threads; t++) {
            final int seed = t;
            Thread w = new Thread(() -> {
                try {
                    if (pin) Bridge.pinCurrentThread();
                    Random rnd = new Random(seed);
                    ByteBuffer kv = Kv.fill(32 * heads * dim, seed + 1f);
                    start.await();
                    while (System.nanoTime() < deadline[0] && failures.isEmpty()) {
                        int[] head = HEADS[rnd.nextInt(HEADS.length)];
                        int len = head.length + 1 + rnd.nextInt(8);
                        int[] seq = new int[len];
                        System.arraycopy(head, 0, seq, 0, head.length);
                        for (int i = head.length; i < len; i++) seq[i] = 1 + rnd.nextInt(20);
                        int promptLen = head.length + rnd.nextInt(len - head.length);
                        int[] prompt = java.util.Arrays.copyOf(seq, promptLen);
                        int id;
                        try {
                            id = pool.bindRequest(prompt, len + rnd.nextInt(8));
                        } catch (KvCacheExhaustedException e) {
                            exhausted.incrementAndGet();
                            Thread.yield();
                            continue;
                        }
                        binds.incrementAndGet();
                        int matched = pool.matchedPrefixLen(id);
                        if (matched > 0) hits.incrementAndGet();
                        if (!pool.isBound(id)) throw new AssertionError("request " + id + " not bound after bind");
                        int written = matched;
                        if (rnd.nextBoolean()) {
                            synchronized (stepLock) {
                                pool.activateStep(id);
                                int n = len - matched;
                                pool.put(0, matched, n, kv, kv);
                                written = pool.kvLen(id);
                                if (written != len) throw new AssertionError("kvLen " + written + " != " + len);
                            }
                            puts.incrementAndGet();
                        }
                        if (rnd.nextInt(3) > 0) {
                            pool.finishRequest(id, seq);
                            finishes.incrementAndGet();
                        } else {
                            pool.unbindRequest(id);
                            unbinds.incrementAndGet();
                        }
                        if (pool.isBound(id)) throw new AssertionError("request " + id + " still bound");
                    }
                } catch (Throwable e) {
                    failures.add(e);
                }
            }, "hammer-" + t);
            w.setDaemon(true); // a stuck worker must not keep the JVM (and pytest) alive
            workers.add(w);
            w.start();
        }
        deadline[0] = System.nanoTime() + millis * 1_000_000L;
        start.countDown();
        long until = System.nanoTime() + joinTimeoutMs * 1_000_000L;
        List<String> stuck = new ArrayList<>();
        for (Thread w : workers) {
            w.join(Math.max(1, (until - System.nanoTime()) / 1_000_000L));
            if (w.isAlive()) {
                StringBuilder sb = new StringBuilder(w.getName());
                for (StackTraceElement e : w.getStackTrace()) sb.append("\n    at ").append(e);
                stuck.add(sb.toString());
            }
        }
        if (!stuck.isEmpty()) {
            throw new AssertionError("deadlock? " + stuck.size() + " workers still running after " + joinTimeoutMs
                    + " ms:\n" + String.join("\n", stuck));
        }
        if (!failures.isEmpty()) {
            AssertionError e = new AssertionError(failures.size() + " worker(s) failed: " + failures.peek(),
                    failures.peek());
            for (Throwable f : failures) if (f != failures.peek()) e.addSuppressed(f);
            throw e;
        }
        pool.checkInvariants();
        if (alone) Check.eq(0, pool.boundRequestCount(), "every request finished or unbound");
        Check.check(binds.get() > 0, "no bind succeeded");
        return new String[] {"binds=" + binds, "finishes=" + finishes, "unbinds=" + unbinds, "puts=" + puts,
                "exhausted=" + exhausted, "hits=" + hits, "tree=" + pool.radixCache().totalSize(),
                "freePages=" + pool.freePages()};
    }
}
