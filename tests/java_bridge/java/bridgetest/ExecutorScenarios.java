package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.nio.charset.CharacterCodingException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import smile.deep.tensor.Tensor;
import smile.llm.LanguageModel;
import smile.llm.cache.KvCacheExhaustedException;
import smile.llm.cache.KvCachePool;
import smile.llm.engine.GenerationHandle;
import smile.llm.engine.GenerationRequest;
import smile.llm.engine.InferenceEngine;
import smile.llm.engine.ModelExecutor;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * The bridged model's {@link ModelExecutor} step API driven from Java: bind, prefill, decodeStep with greedy argmax
 * here, finish and evict, checked token for token against the Python model's greedy {@code generate}. Every wait
 * is bounded.
 */
public final class ExecutorScenarios {
    private ExecutorScenarios() {}

    private static final long TIMEOUT_S = 120;

    /** New tokens per request (set from the test's scale). */
    public static int newTokens = 8;

    static PythonLanguageModel lm() {
        return Bridge.languageModel();
    }

    static ModelExecutor ex() {
        return lm().executor();
    }

    static int[] prompt(String tag) {
        return lm().encode("class Executor" + tag + ":\n    def ");
    }

    static int[] generate(int[] prompt) {
        return lm().generate(prompt, newTokens, 0, 1, false, 0, null).completionTokens();
    }

    static int argmax(float[] data, int row, int vocab) {
        int best = 0;
        for (int v = 1; v < vocab; v++) {
            if (data[row * vocab + v] > data[row * vocab + best]) best = v;
        }
        return best;
    }

    static boolean isStop(ModelExecutor ex, int token) {
        for (int s : ex.stopTokens()) {
            if (s == token) return true;
        }
        return false;
    }

    static int[] concat(int[] a, List<Integer> b) {
        int[] out = Arrays.copyOf(a, a.length + b.size());
        for (int i = 0; i < b.size(); i++) out[a.length + i] = b.get(i);
        return out;
    }

    /** One greedy request through the step API; {@code prefixLen} receives what bind matched. */
    static int[] stepGreedy(ModelExecutor ex, int[] prompt, int[] prefixLen) {
        int kv = ex.bind(prompt, prompt.length + newTokens);
        try {
            int matched = ex.prefixLen(kv);
            if (prefixLen != null) prefixLen[0] = matched;
            Tensor logits = ex.prefill(kv, prompt, matched);
            int vocab = lm().vocabSize();
            eq(new long[] {1, vocab}, logits.shape(), "prefill logits shape");
            List<Integer> out = new ArrayList<>();
            int token = argmax(logits.floatArray(), 0, vocab);
            while (!isStop(ex, token)) {
                out.add(token);
                if (out.size() == newTokens) break;
                Tensor next = ex.decodeStep(new int[] {kv}, new int[] {token},
                        new int[] {prompt.length + out.size() - 1});
                token = argmax(next.floatArray(), 0, vocab);
            }
            ex.finish(kv, concat(prompt, out));
            return out.stream().mapToInt(Integer::intValue).toArray();
        } finally {
            ex.evict(kv);  // a no-op after finish
        }
    }

    static void assertPoolClean(String when) {
        AsyncScenarios.assertPoolClean(when);
    }

    @Scenario
    public static void stepApiGreedyEqualsGenerate(List<String> log) {
        ModelExecutor ex = ex();
        check(ex.supportsStepApi(), "the step API is supported");
        check(ex.model() == lm(), "model() is the bridged model");
        eq(lm().maxSeqLen(), ex.maxSeqLen(), "maxSeqLen");
        for (String tag : new String[] {"A", "Bb"}) {
            int[] p = prompt(tag);
            eq(generate(p), stepGreedy(ex, p, null), "prompt " + tag + ": step API equals greedy generate");
        }
        assertPoolClean("after the step API");
        log.add("ok");
    }

    @Scenario
    public static void batchedDecodeStepEqualsSolo(List<String> log) {
        ModelExecutor ex = ex();
        int[][] prompts = {prompt("Left"), lm().encode("def batched_right(x, y, z):\n    return ")};
        int[][] solo = new int[2][];
        for (int i = 0; i < 2; i++) solo[i] = stepGreedy(ex, prompts[i], null);
        int vocab = lm().vocabSize();
        int[] kv = new int[2];
        List<List<Integer>> out = List.of(new ArrayList<>(), new ArrayList<>());
        int[] last = new int[2];
        try {
            for (int i = 0; i < 2; i++) {
                kv[i] = ex.bind(prompts[i], prompts[i].length + newTokens);
                Tensor logits = ex.prefill(kv[i], prompts[i], ex.prefixLen(kv[i]));
                last[i] = argmax(logits.floatArray(), 0, vocab);
                out.get(i).add(last[i]);
            }
            for (int step = 1; step < newTokens; step++) {
                int[] positions = {prompts[0].length + step - 1, prompts[1].length + step - 1};
                Tensor logits = ex.decodeStep(kv, last, positions);
                eq(new long[] {2, vocab}, logits.shape(), "decodeStep logits shape");
                float[] data = logits.floatArray();
                for (int i = 0; i < 2; i++) {
                    last[i] = argmax(data, i, vocab);
                    out.get(i).add(last[i]);
                }
            }
        } finally {
            for (int k : kv) if (k > 0) ex.evict(k);
        }
        for (int i = 0; i < 2; i++) {
            int[] got = out.get(i).stream().mapToInt(Integer::intValue).toArray();
            int n = Math.min(got.length, solo[i].length);  // solo stops at a stop token
            eq(Arrays.copyOf(solo[i], n), Arrays.copyOf(got, n), "row " + i + " batched equals solo");
        }
        assertPoolClean("after batched decode");
        log.add("ok");
    }

    @Scenario
    public static void finishInsertsAndPrefixIsReused(List<String> log) {
        ModelExecutor ex = ex();
        KvCachePool pool = ex.kvCachePool();
        int[] p = lm().encode("# a fresh prompt for the prefix cache of the executor, long enough\n");
        check(p.length > 2 * pool.pageSize(), "prompt spans pages");
        long inserted = pool.prefixInsertTokens();
        int[] matched = new int[1];
        int[] first = stepGreedy(ex, p, matched);
        eq(0, matched[0], "a fresh prompt matches nothing");
        check(pool.prefixInsertTokens() > inserted, "finish inserted the sequence into the prefix cache");
        int[] second = stepGreedy(ex, p, matched);
        check(matched[0] > 0 && matched[0] % pool.pageSize() == 0 && matched[0] < p.length,
                "the second bind reuses a cached prefix: " + matched[0]);
        eq(first, second, "the same tokens with the cached prefix");
        eq(generate(p), second, "and the same as greedy generate");
        assertPoolClean("after prefix reuse");
        log.add("prefixLen=" + matched[0]);
    }

    @Scenario
    public static void chunkedPrefillEqualsWholePrefill(List<String> log) {
        ModelExecutor ex = ex();
        int[] p = prompt("Chunked");
        int vocab = lm().vocabSize();
        int a = ex.bind(p, p.length + 1);
        int b = ex.bind(p, p.length + 1);
        try {
            float[] whole = ex.prefill(a, p, ex.prefixLen(a)).floatArray();
            int from = ex.prefixLen(b);
            int mid = from + (p.length - from) / 2;
            check(ex.prefillChunk(b, p, from, mid) == null, "a chunk before the prompt's end has no logits");
            float[] chunked = ex.prefillChunk(b, p, mid, p.length).floatArray();
            eq(argmax(whole, 0, vocab), argmax(chunked, 0, vocab), "the same next token");
            for (int v = 0; v < vocab; v++) {
                check(Math.abs(whole[v] - chunked[v]) < 1e-3, "logit " + v + ": " + whole[v] + " vs " + chunked[v]);
            }
        } finally {
            ex.evict(a);
            ex.evict(b);
        }
        assertPoolClean("after chunked prefill");
        log.add("ok");
    }

    @Scenario
    public static void evictFreesPagesAndExhaustionIsRefused(List<String> log) {
        ModelExecutor ex = ex();
        KvCachePool pool = ex.kvCachePool();
        int free = pool.freePages();
        int[] p = lm().encode("# evicted before it finishes: nothing of it is cached\n");
        int kv = ex.bind(p, p.length + newTokens);
        eq(0, ex.prefixLen(kv), "nothing matched");
        check(pool.freePages() < free, "bind took pages");
        Tensor logits = ex.prefill(kv, p, 0);
        int token = argmax(logits.floatArray(), 0, lm().vocabSize());
        ex.decodeStep(new int[] {kv}, new int[] {token}, new int[] {p.length});
        ex.evict(kv);
        eq(free, pool.freePages(), "evict gave every page back");
        ex.evict(kv);  // again: nothing
        eq(free, pool.freePages(), "a second evict changes nothing");
        expect(IllegalArgumentException.class, "requestId", () -> ex.prefixLen(kv));
        // fill the pool, then one more bind is refused with the pool's exception
        List<Integer> held = new ArrayList<>();
        int cap = Math.min(ex.maxSeqLen(), pool.numSlots());
        try {
            expect(KvCacheExhaustedException.class, "", () -> {
                for (int i = 0; i <= pool.numSlots() / cap; i++) held.add(ex.bind(p, cap));
            });
            check(!held.isEmpty(), "some binds fit");
        } finally {
            for (int k : held) ex.evict(k);
        }
        assertPoolClean("after exhaustion");
        log.add("held=" + held.size());
    }

    @Scenario
    public static void badArgumentsAreRefusedByName(List<String> log) throws Exception {
        ModelExecutor ex = ex();
        int[] p = prompt("Bad");
        int vocab = lm().vocabSize();
        Class<IllegalArgumentException> iae = IllegalArgumentException.class;
        expect(iae, "prompt must not be null", () -> ex.bind(null, 4));
        expect(iae, "prompt must not be empty", () -> ex.bind(new int[0], 4));
        expect(iae, "prompt[1] = " + vocab, () -> ex.bind(new int[] {1, vocab}, 4));
        expect(iae, "totalCapacity", () -> ex.bind(p, p.length - 1));
        expect(iae, "totalCapacity", () -> ex.bind(p, ex.maxSeqLen() + 1));
        expect(iae, "requestId = 987654", () -> ex.prefixLen(987654));
        expect(iae, "requestId = 987654", () -> ex.prefill(987654, p, 0));
        expect(iae, "requestId = 987654", () -> ex.finish(987654, p));
        int kv = ex.bind(p, p.length + 4);
        try {
            int[] other = Arrays.copyOf(p, p.length);
            other[other.length - 1] = (other[other.length - 1] + 1) % vocab;
            expect(iae, "prompt must be the prompt bound", () -> ex.prefill(kv, other, 0));
            expect(iae, "prompt must not be null", () -> ex.prefill(kv, null, 0));
            expect(iae, "prefixLen must be request", () -> ex.prefill(kv, p, 3));
            expect(iae, "to must be in", () -> ex.prefillChunk(kv, p, 0, 0));
            expect(iae, "to must be in", () -> ex.prefillChunk(kv, p, 0, p.length + 1));
            expect(iae, "from must be request", () -> ex.prefillChunk(kv, p, 1, p.length));
            expect(iae, "prefill it first", () -> ex.decodeStep(new int[] {kv}, new int[] {1}, new int[] {0}));
            int token = argmax(ex.prefill(kv, p, 0).floatArray(), 0, vocab);
            int pos = p.length;
            expect(iae, "prefixLen must be request", () -> ex.prefill(kv, p, 0));
            expect(iae, "requestIds must not be null", () -> ex.decodeStep(null, new int[] {token},
                    new int[] {pos}));
            expect(iae, "requestIds must not be empty", () -> ex.decodeStep(new int[0], new int[0], new int[0]));
            expect(iae, "lastTokens has 2 entries", () -> ex.decodeStep(new int[] {kv}, new int[] {token, token},
                    new int[] {pos}));
            expect(iae, "positions has 0 entries", () -> ex.decodeStep(new int[] {kv}, new int[] {token},
                    new int[0]));
            expect(iae, "lastTokens[0] = -1", () -> ex.decodeStep(new int[] {kv}, new int[] {-1}, new int[] {pos}));
            expect(iae, "requestIds[1] = " + kv + " repeats", () -> ex.decodeStep(new int[] {kv, kv},
                    new int[] {token, token}, new int[] {pos, pos}));
            expect(iae, "requestIds[0] = 987654", () -> ex.decodeStep(new int[] {987654}, new int[] {token},
                    new int[] {pos}));
            expect(iae, "positions[0] = " + (pos + 1), () -> ex.decodeStep(new int[] {kv}, new int[] {token},
                    new int[] {pos + 1}));
            int[] wrong = Arrays.copyOf(p, p.length + 1);
            wrong[0] = (wrong[0] + 1) % vocab;
            expect(iae, "sequenceTokens must start with", () -> ex.finish(kv, wrong));
            // after every refusal the request is intact: it decodes to its capacity, then no further
            int t = token;
            for (int i = 0; i < 4; i++) {
                t = argmax(ex.decodeStep(new int[] {kv}, new int[] {t}, new int[] {pos + i}).floatArray(), 0, vocab);
            }
            int last = t;
            expect(iae, "totalCapacity", () -> ex.decodeStep(new int[] {kv}, new int[] {last},
                    new int[] {pos + 4}));
        } finally {
            ex.evict(kv);
        }
        expect(iae, "requestId = " + kv, () -> ex.finish(kv, p));
        assertPoolClean("after the refusals");
        log.add("ok");
    }

    @Scenario
    public static void stepCallsConcurrentWithGenerateKeepBothCorrect(List<String> log) throws Exception {
        ModelExecutor ex = ex();
        int n = 3;
        int[][] prompts = new int[n][];
        int[][] want = new int[n][];
        for (int i = 0; i < n; i++) {
            prompts[i] = prompt("Concurrent" + i);
            want[i] = generate(prompts[i]);
        }
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch start = new CountDownLatch(1);
        Thread[] threads = new Thread[2];
        int rounds = 3;
        for (int k = 0; k < threads.length; k++) {
            int first = k;
            threads[k] = new Thread(() -> {
                try {
                    check(start.await(TIMEOUT_S, TimeUnit.SECONDS), "start");
                    for (int r = 0; r < rounds; r++) {
                        int i = (first + r) % n;
                        eq(want[i], generate(prompts[i]), "generate on another thread, prompt " + i);
                    }
                } catch (Throwable t) {
                    failure.compareAndSet(null, t);
                }
            }, "generate-" + k);
            threads[k].start();
        }
        start.countDown();
        for (int r = 0; r < rounds; r++) {
            for (int i = 0; i < n; i++) {
                eq(want[i], stepGreedy(ex, prompts[i], null), "step API beside generate, prompt " + i);
            }
        }
        for (Thread t : threads) {
            t.join(TimeUnit.SECONDS.toMillis(TIMEOUT_S));
            check(!t.isAlive(), "a generate thread never returned");
        }
        if (failure.get() != null) throw new AssertionError("a generate thread failed", failure.get());
        assertPoolClean("after concurrent calls");
        log.add("ok");
    }

    /** A plain Java {@link ModelExecutor} over another one, so that {@link InferenceEngine} drives its steps. */
    static final class Delegate implements ModelExecutor {
        final ModelExecutor inner;

        Delegate(ModelExecutor inner) {
            this.inner = inner;
        }

        @Override public LanguageModel model() { return inner.model(); }
        @Override public KvCachePool kvCachePool() { return inner.kvCachePool(); }
        @Override public int padToken() { return inner.padToken(); }
        @Override public int[] stopTokens() { return inner.stopTokens(); }
        @Override public String decode(int[] tokens) { return inner.decode(tokens); }
        @Override public String tryDecode(int[] t, boolean s) throws CharacterCodingException {
            return inner.tryDecode(t, s);
        }
        @Override public boolean supportsStepApi() { return inner.supportsStepApi(); }
        @Override public int maxSeqLen() { return inner.maxSeqLen(); }
        @Override public int bind(int[] prompt, int capacity) { return inner.bind(prompt, capacity); }
        @Override public int prefixLen(int id) { return inner.prefixLen(id); }
        @Override public Tensor prefill(int id, int[] prompt, int prefixLen) {
            return inner.prefill(id, prompt, prefixLen);
        }
        @Override public Tensor prefillChunk(int id, int[] prompt, int from, int to) {
            return inner.prefillChunk(id, prompt, from, to);
        }
        @Override public Tensor decodeStep(int[] ids, int[] tokens, int[] positions) {
            return inner.decodeStep(ids, tokens, positions);
        }
        @Override public void finish(int id, int[] sequence) { inner.finish(id, sequence); }
        @Override public void evict(int id) { inner.evict(id); }
    }

    @Scenario
    public static void javaStepLoopOverTheExecutorEqualsGenerate(List<String> log) throws Exception {
        int n = 4;
        int[][] prompts = new int[n][];
        int[][] want = new int[n][];
        for (int i = 0; i < n; i++) {
            prompts[i] = prompt("Loop" + i);
            want[i] = generate(prompts[i]);
        }
        // a small prefill budget: prompts are prefilled in chunks over several ticks
        try (InferenceEngine engine = new InferenceEngine(new Delegate(ex()), n, n, 7, 60_000)) {
            GenerationHandle[] hs = new GenerationHandle[n];
            for (int i = 0; i < n; i++) {
                hs[i] = engine.submit(GenerationRequest.ofTokens(prompts[i], newTokens, 0.0, 1.0, false, 0, null));
            }
            for (int i = 0; i < n; i++) {
                eq(want[i], hs[i].future().get(TIMEOUT_S, TimeUnit.SECONDS).completionTokens(),
                        "request " + i + " through the Java step loop equals greedy generate");
            }
            eq(n, engine.completedCount(), "completed");
        }
        assertPoolClean("after the Java step loop");
        log.add("requests=" + n);
    }
}
