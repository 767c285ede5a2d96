package bridgetest;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CyclicBarrier;
import java.util.function.BooleanSupplier;
import smile.llm.ChatCompletion;
import smile.llm.GenerationListener;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * Good and bad calls into the Python model and a Python pool from many Java threads at once: every outcome is
 * recorded as a string ("ok", or the Java exception's class and message), so the test can compare what each case
 * gives under load with what it gives alone on one thread. The listener's and the cancel supplier's own exceptions
 * are checked here to come back as the very same objects.
 */
public final class MappingUnderLoad {
    private MappingUnderLoad() {}

    /** The cases, in the order one thread runs them (each thread starts at a different one). */
    public static final String[] CASES = {
        "encode-good", "encode-null", "decode-good", "decode-out-of-vocabulary", "decode-negative",
        "generate-good", "generate-null-prompt", "generate-out-of-vocabulary", "generate-bad-temperature",
        "generate-listener-throws", "generate-cancel-throws", "generate-cancelled",
        "pool-bind-unbind", "pool-bind-null", "pool-bind-exhausted", "pool-kvlen-unknown",
    };

    /** Cases whose exception message names pool state that other threads change: compared by class only. */
    private static final List<String> CLASS_ONLY = List.of("pool-bind-exhausted", "pool-kvlen-unknown");

    /** The listener's exception (unchecked, private to the tests). */
    public static final class ListenerBoom extends RuntimeException {
        public ListenerBoom(String message) {
            super(message);
        }
    }

    /** The cancel supplier's exception. */
    public static final class CancelBoom extends RuntimeException {
        public CancelBoom(String message) {
            super(message);
        }
    }

    /** What the good calls must return: the solo results, computed in Python. */
    public record Expected(String text, int[] ids, int[] prompt, int[] tokens, int maxGenLen) {}

    /** Every case once on the calling thread: case -> outcome. */
    public static Map<String, String> solo(PythonLanguageModel lm, KvCachePool pool, Expected want) {
        Map<String, String> out = new TreeMap<>();
        for (String c : CASES) out.put(c, run(c, lm, pool, want));
        return out;
    }

    /**
     * {@code threads} Java threads (those with an odd index pinned first, {@link Bridge#pinCurrentThread()}), each
     * running every case {@code rounds} times, starting together; returns "case => outcome" -> count.
     */
    public static Map<String, Integer> concurrent(PythonLanguageModel lm, KvCachePool pool, Expected want, int threads,
                                                  int rounds) throws Exception {
        CyclicBarrier start = new CyclicBarrier(threads);
        List<List<String>> results = new ArrayList<>();
        Thread[] ts = new Thread[threads];
        Throwable[] died = new Throwable[threads];
        for (int i = 0; i < threads; i++) {
            List<String> mine = new ArrayList<>();
            results.add(mine);
            int me = i;
            ts[i] = new Thread(() -> {
                try {
                    if (me % 2 == 1) Bridge.pinCurrentThread();
                    start.await();
                    for (int r = 0; r < rounds; r++) {
                        for (int k = 0; k < CASES.length; k++) {
                            String c = CASES[(k + me) % CASES.length];
                            mine.add(c + " => " + run(c, lm, pool, want));
                        }
                    }
                } catch (Throwable t) {
                    died[me] = t;
                }
            }, "mapping-" + i);
            ts[i].setDaemon(true);
            ts[i].start();
        }
        for (Thread t : ts) t.join(120_000);
        for (int i = 0; i < threads; i++) {
            if (ts[i].isAlive()) throw new AssertionError("thread " + i + " still running after 120 s");
            if (died[i] != null) throw new AssertionError("thread " + i + " died: " + died[i], died[i]);
        }
        Map<String, Integer> counts = new TreeMap<>();
        for (List<String> l : results) for (String s : l) counts.merge(s, 1, Integer::sum);
        return counts;
    }

    /** One case: "ok" (its result checked against {@code want}) or what it threw. */
    static String run(String c, PythonLanguageModel lm, KvCachePool pool, Expected want) {
        int vocab = lm.vocabSize();
        try {
            switch (c) {
                case "encode-good" -> Check.eq(want.ids(), lm.encode(want.text()), "encode");
                case "encode-null" -> lm.encode(null);
                case "decode-good" -> Check.eq(want.text(), lm.decode(want.ids()), "decode");
                case "decode-out-of-vocabulary" -> lm.decode(new int[] {1, vocab + 5});
                case "decode-negative" -> lm.decode(new int[] {-3});
                case "generate-good" -> {
                    ChatCompletion done = lm.generate(want.prompt(), want.maxGenLen(), 0.0, 1.0, false, 0L, null);
                    Check.eq(want.tokens(), done.completionTokens(), "greedy tokens under load");
                }
                case "generate-null-prompt" -> lm.generate(null, 4, 0.0, 1.0, false, 0L, null);
                case "generate-out-of-vocabulary" -> lm.generate(new int[] {1, vocab + 5}, 4, 0.0, 1.0, false, 0L,
                        null);
                case "generate-bad-temperature" -> lm.generate(want.prompt(), 4, -1.0, 1.0, false, 0L, null);
                case "generate-listener-throws" -> {
                    ListenerBoom boom = new ListenerBoom("listener boom");
                    GenerationListener l = new GenerationListener() {
                        @Override public void onGeneratedTokens(int n) { throw boom; }
                    };
                    try {
                        lm.generate(want.prompt(), want.maxGenLen(), 0.0, 1.0, false, 0L, l);
                    } catch (ListenerBoom e) {
                        return e == boom ? "the listener's own ListenerBoom" : "a different ListenerBoom";
                    }
                }
                case "generate-cancel-throws" -> {
                    CancelBoom boom = new CancelBoom("cancel boom");
                    BooleanSupplier cancel = () -> {
                        throw boom;
                    };
                    try {
                        lm.generate(want.prompt(), want.maxGenLen(), 0.0, 1.0, false, 0L, null, cancel);
                    } catch (CancelBoom e) {
                        return e == boom ? "the supplier's own CancelBoom" : "a different CancelBoom";
                    }
                }
                case "generate-cancelled" -> lm.generate(want.prompt(), want.maxGenLen(), 0.0, 1.0, false, 0L, null,
                        () -> true);
                case "pool-bind-unbind" -> {
                    int id = pool.bindRequest(new int[] {1, 2, 3}, 16);
                    Check.check(pool.isBound(id), "bound after bindRequest");
                    pool.unbindRequest(id);
                }
                case "pool-bind-null" -> pool.bindRequest(null, 16);
                case "pool-bind-exhausted" -> pool.bindRequest(new int[] {1, 2, 3}, 1_000_000);
                case "pool-kvlen-unknown" -> pool.kvLen(987_654);
                default -> throw new AssertionError("no case " + c);
            }
            return "ok";
        } catch (AssertionError e) {
            throw e;
        } catch (Throwable t) {
            String name = t.getClass().getName();
            return CLASS_ONLY.contains(c) ? name : name + ": " + t.getMessage();
        }
    }
}
