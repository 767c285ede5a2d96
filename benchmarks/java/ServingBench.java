import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CyclicBarrier;
import smile.llm.Completion;
import smile.llm.LanguageModel;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * Timing loops of benchmarks/java_serving.py, timed in Java with System.nanoTime: the same greedy requests sent
 * one after another from one thread, from one Java thread each at once, and through the asynchronous API.
 */
public final class ServingBench {
    private ServingBench() {}

    /** generate() of every prompt in turn on the calling thread; the tokens go to {@code out}. Nanoseconds. */
    public static long sequential(LanguageModel lm, int[][] prompts, int n, int[][] out) {
        long t0 = System.nanoTime();
        for (int i = 0; i < prompts.length; i++) {
            out[i] = lm.generate(prompts[i], n, 0.0, 1.0, false, 0, null).completionTokens();
        }
        return System.nanoTime() - t0;
    }

    /**
     * One JVM-created thread per prompt calls generate() at once (released together by a barrier; pinned with
     * Bridge.pinCurrentThread() first when {@code pin}). Nanoseconds from the release to the last thread's end.
     */
    public static long concurrent(LanguageModel lm, int[][] prompts, int n, int[][] out, boolean pin)
            throws Exception {
        CyclicBarrier start = new CyclicBarrier(prompts.length + 1);
        Throwable[] failure = new Throwable[1];
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < prompts.length; i++) {
            final int row = i;
            Thread t = new Thread(() -> {
                try {
                    if (pin) Bridge.pinCurrentThread();
                    start.await();
                    out[row] = lm.generate(prompts[row], n, 0.0, 1.0, false, 0, null).completionTokens();
                } catch (Throwable e) {
                    synchronized (failure) {
                        failure[0] = e;
                    }
                }
            }, "bench-caller-" + i);
            t.start();
            threads.add(t);
        }
        start.await();
        long t0 = System.nanoTime();
        for (Thread t : threads) t.join();
        long elapsed = System.nanoTime() - t0;
        if (failure[0] != null) throw new RuntimeException("a caller failed", failure[0]);
        return elapsed;
    }

    /** submit() of every prompt from the calling thread, then join() of every future. Nanoseconds. */
    public static long submitted(PythonLanguageModel lm, int[][] prompts, int n, int[][] out) {
        long t0 = System.nanoTime();
        List<CompletableFuture<Completion>> futures = new ArrayList<>();
        for (int[] p : prompts) futures.add(lm.submit(p, n, 0.0, 1.0, false, 0, null));
        for (int i = 0; i < prompts.length; i++) out[i] = futures.get(i).join().tokens();
        return System.nanoTime() - t0;
    }
}
