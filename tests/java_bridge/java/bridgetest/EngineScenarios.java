package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import smile.deep.tensor.Tensor;
import smile.llm.ChatCompletion;
import smile.llm.FinishReason;
import smile.llm.GenerationListener;
import smile.llm.LanguageModel;
import smile.llm.Message;
import smile.llm.cache.KvCacheExhaustedException;
import smile.llm.cache.KvCachePool;
import smile.llm.engine.GenerationHandle;
import smile.llm.engine.GenerationRequest;
import smile.llm.engine.InferenceEngine;
import smile.llm.engine.ModelExecutor;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * {@link InferenceEngine} over a fake Java {@link ModelExecutor} (the engine's own step loop), and over the bridged
 * Python model (its serving loop). Every wait is bounded.
 */
public final class EngineScenarios {
    private EngineScenarios() {}

    private static final long TIMEOUT_S = 60;

    /** New tokens per bridged request (set from the test's scale). */
    public static int newTokens = 8;

    /**
     * A model whose next token is the last one plus 1 (mod {@link #VOCAB}); token 0 is its stop token. It checks
     * every step against what it bound, and records what the engine asked of it.
     */
    static final class Fake implements ModelExecutor {
        static final int VOCAB = 32;
        final int slots;
        final int maxSeqLen;
        volatile boolean stepApi = true;
        volatile long decodeSleepMs;
        volatile CountDownLatch gate;  // when set, decode steps wait for it (bounded)
        final CountDownLatch decoding = new CountDownLatch(1);
        final AtomicInteger nextId = new AtomicInteger(1);
        final Map<Integer, Integer> bound = Collections.synchronizedMap(new HashMap<>());  // id -> capacity
        final Map<Integer, Integer> written = Collections.synchronizedMap(new HashMap<>()); // id -> positions
        final List<Integer> bindOrder = Collections.synchronizedList(new ArrayList<>());
        final List<Integer> chunks = Collections.synchronizedList(new ArrayList<>());
        final List<Integer> batches = Collections.synchronizedList(new ArrayList<>());
        final AtomicInteger maxBound = new AtomicInteger();
        final AtomicInteger finished = new AtomicInteger();
        final AtomicInteger evicted = new AtomicInteger();
        final AtomicInteger generateCalls = new AtomicInteger();

        Fake(int slots, int maxSeqLen) {
            this.slots = slots;
            this.maxSeqLen = maxSeqLen;
        }

        int usedSlots() {
            synchronized (bound) {
                return bound.values().stream().mapToInt(Integer::intValue).sum();
            }
        }

        static Tensor peaked(int[] next) {
            float[] data = new float[next.length * VOCAB];
            for (int i = 0; i < next.length; i++) {
                for (int v = 0; v < VOCAB; v++) data[i * VOCAB + v] = -v * 0.01f;
                data[i * VOCAB + next[i]] = 10f;
            }
            return Tensor.of(data, next.length, VOCAB);
        }

        static int after(int token) {
            return (token + 1) % VOCAB;
        }

        @Override public LanguageModel model() {
            Fake self = this;
            return new LanguageModel() {
                @Override public String family() { return "test/fake"; }
                @Override public String name() { return "fake"; }
                @Override public int maxSeqLen() { return self.maxSeqLen; }
                @Override public int[] encodeChat(Message... dialog) {
                    return new int[] {dialog.length, dialog[dialog.length - 1].content().length() % VOCAB};
                }
                @Override public ChatCompletion generate(int[] prompt, int maxGenLen, double t, double p,
                                                         boolean lp, long seed, GenerationListener l,
                                                         BooleanSupplier cancel) {
                    generateCalls.incrementAndGet();
                    int[] out = new int[maxGenLen];
                    int last = prompt[prompt.length - 1];
                    for (int i = 0; i < maxGenLen; i++) {
                        if (cancel != null && cancel.getAsBoolean()) throw new CancellationException("cancelled");
                        out[i] = last = after(last);
                    }
                    return new ChatCompletion("fake", self.decode(out), prompt, out, FinishReason.length, null);
                }
                @Override public ChatCompletion chat(Message[] d, int n, double t, double p, boolean lp, long s,
                                                     GenerationListener l, BooleanSupplier c) {
                    return generate(encodeChat(d), n, t, p, lp, s, l, c);
                }
            };
        }

        @Override public KvCachePool kvCachePool() { return null; }
        @Override public int padToken() { return 0; }
        @Override public int[] stopTokens() { return new int[] {0}; }
        @Override public boolean supportsStepApi() { return stepApi; }
        @Override public int maxSeqLen() { return maxSeqLen; }

        @Override public String decode(int[] tokens) {
            StringBuilder b = new StringBuilder();
            for (int t : tokens) b.append((char) ('a' + t % 26));
            return b.toString();
        }

        @Override public String tryDecode(int[] tokens, boolean skipSpecial) {
            return decode(tokens);
        }

        @Override public int bind(int[] prompt, int totalCapacity) {
            synchronized (bound) {
                if (usedSlots() + totalCapacity > slots) {
                    throw new KvCacheExhaustedException("no room for " + totalCapacity + " slots");
                }
                int id = nextId.getAndIncrement();
                bound.put(id, totalCapacity);
                written.put(id, 0);
                bindOrder.add(prompt[0]);
                maxBound.accumulateAndGet(bound.size(), Math::max);
                return id;
            }
        }

        @Override public int prefixLen(int requestId) { return 0; }

        @Override public Tensor prefill(int requestId, int[] prompt, int prefixLen) {
            return prefillChunk(requestId, prompt, prefixLen, prompt.length);
        }

        @Override public Tensor prefillChunk(int requestId, int[] prompt, int from, int to) {
            check(bound.containsKey(requestId), "prefill of an unbound request");
            eq(from, (long) written.get(requestId), "prefill starts where the last chunk ended");
            written.put(requestId, to);
            chunks.add(to - from);
            return to < prompt.length ? null : peaked(new int[] {after(prompt[prompt.length - 1])});
        }

        @Override public Tensor decodeStep(int[] requestIds, int[] lastTokens, int[] positions) {
            batches.add(requestIds.length);
            decoding.countDown();
            CountDownLatch g = gate;
            try {
                if (g != null) g.await(TIMEOUT_S, TimeUnit.SECONDS);
                if (decodeSleepMs > 0) Thread.sleep(decodeSleepMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            int[] next = new int[requestIds.length];
            for (int i = 0; i < requestIds.length; i++) {
                Integer pos = written.get(requestIds[i]);
                check(pos != null, "decode of an unbound request");
                eq((long) pos, positions[i], "row " + i + " writes its next position");
                check(positions[i] < bound.get(requestIds[i]), "position within the bound capacity");
                written.put(requestIds[i], pos + 1);
                next[i] = after(lastTokens[i]);
            }
            return peaked(next);
        }

        @Override public void finish(int requestId, int[] sequenceTokens) {
            check(bound.remove(requestId) != null, "finish of a bound request");
            finished.incrementAndGet();
        }

        @Override public void evict(int requestId) {
            check(bound.remove(requestId) != null, "evict of a bound request");
            evicted.incrementAndGet();
        }
    }

    static GenerationRequest tokens(int[] prompt, int maxGen, GenerationListener l) {
        return GenerationRequest.ofTokens(prompt, maxGen, 0.0, 1.0, false, 0, l);
    }

    static ChatCompletion await(GenerationHandle h) throws Exception {
        return h.future().get(TIMEOUT_S, TimeUnit.SECONDS);
    }

    /** Polls {@code condition} for at most {@link #TIMEOUT_S} seconds. */
    static void eventually(BooleanSupplier condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(TIMEOUT_S);
        while (!condition.getAsBoolean()) {
            check(System.nanoTime() < deadline, "timed out waiting until " + what);
            Thread.sleep(2);
        }
    }

    static final class Events implements GenerationListener {
        final List<String> events = Collections.synchronizedList(new ArrayList<>());
        final StringBuilder text = new StringBuilder();

        @Override public void onInputTokens(int n) { events.add("in:" + n); }
        @Override public void onCachedInputTokens(int n) { events.add("cache:" + n); }
        @Override public void onGeneratedTokens(int n) { events.add("gen:" + n); }
        @Override public synchronized void onText(String chunk) { events.add("text"); text.append(chunk); }
    }

    // ------------------------------------------------------------------ the Java step loop

    @Scenario
    public static void stopTokenMaxGenLenAndListenerEvents(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        try (InferenceEngine engine = new InferenceEngine(fake, 2)) {
            Events events = new Events();
            ChatCompletion stopped = await(engine.submit(tokens(new int[] {5, 28}, 10, events)));
            eq(new int[] {29, 30, 31}, stopped.completionTokens(), "tokens before the stop token");
            eq(FinishReason.stop, stopped.reason(), "reason");
            eq("fake", stopped.model(), "model");
            eq(fake.decode(new int[] {29, 30, 31}), stopped.content(), "content");
            eq(stopped.content(), events.text.toString(), "streamed text");
            eq(List.of("in:2", "cache:0", "gen:1", "text", "gen:1", "text", "gen:1", "text"), events.events,
                    "listener events");
            ChatCompletion capped = await(engine.submit(tokens(new int[] {3}, 4, null)));
            eq(new int[] {4, 5, 6, 7}, capped.completionTokens(), "maxGenLen tokens");
            eq(FinishReason.length, capped.reason(), "reason");
            ChatCompletion none = await(engine.submit(tokens(new int[] {3}, 0, null)));
            eq(0, none.completionTokens().length, "maxGenLen 0");
            ChatCompletion window = await(engine.submit(tokens(new int[60], 50, null)));
            eq(4, window.completionTokens().length, "capped by maxSeqLen");
            eq(4, engine.completedCount(), "completed");
            eventually(() -> fake.bound.isEmpty(), "every request released");
            eq(4, fake.finished.get(), "finished through finish()");
            eq(0, fake.evicted.get(), "nothing evicted");
        }
        log.add("ok");
    }

    @Scenario
    public static void fcfsAdmissionMaxInFlightAndDecodeBatching(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        fake.decodeSleepMs = 1;
        try (InferenceEngine engine = new InferenceEngine(fake, 3, 2, 64, 0)) {
            eq(3, engine.maxInFlight(), "maxInFlight");
            eq(2, engine.maxDecodeBatch(), "maxDecodeBatch");
            List<GenerationHandle> hs = new ArrayList<>();
            for (int i = 1; i <= 7; i++) hs.add(engine.submit(tokens(new int[] {i, i}, 6, null)));
            for (int i = 1; i <= 7; i++) {
                int[] want = new int[6];
                for (int k = 0; k < 6; k++) want[k] = (i + 1 + k) % Fake.VOCAB;
                eq(want, await(hs.get(i - 1)).completionTokens(), "request " + i + " continues its own row");
                eq(i, hs.get(i - 1).requestId(), "ids in submission order");
            }
            eq(List.of(1, 2, 3, 4, 5, 6, 7), fake.bindOrder, "admitted first come, first served");
            eq(3, fake.maxBound.get(), "at most maxInFlight bound");
            check(fake.batches.stream().allMatch(b -> b <= 2), "decode batches within maxDecodeBatch: "
                    + fake.batches);
            check(fake.batches.contains(2), "rows decoded together: " + fake.batches);
        }
        InferenceEngine clamp = new InferenceEngine(fake, 2, 5, 64, 0);
        eq(2, clamp.maxDecodeBatch(), "maxDecodeBatch is at most maxInFlight");
        clamp.close();
        log.add("batches=" + fake.batches.size());
    }

    @Scenario
    public static void prefillIsChunkedWithinTheBudget(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        try (InferenceEngine engine = new InferenceEngine(fake, 2, 2, 4, 0)) {
            eq(4, engine.prefillTokenBudget(), "prefillTokenBudget");
            int[] prompt = new int[10];
            for (int i = 0; i < 10; i++) prompt[i] = i + 1;
            ChatCompletion c = await(engine.submit(tokens(prompt, 2, null)));
            eq(new int[] {11, 12}, c.completionTokens(), "tokens after a chunked prefill");
            eq(List.of(4, 4, 2), fake.chunks, "chunks of at most the budget");
        }
        log.add("ok");
    }

    @Scenario
    public static void aKvPoolThatIsFullDefersAdmission(List<String> log) throws Exception {
        Fake fake = new Fake(20, 64);
        try (InferenceEngine engine = new InferenceEngine(fake, 4)) {
            GenerationHandle a = engine.submit(tokens(new int[] {1, 2, 3, 4}, 10, null));
            GenerationHandle b = engine.submit(tokens(new int[] {5, 6, 7, 8}, 10, null));
            eq(10, await(a).completionTokens().length, "first");
            eq(10, await(b).completionTokens().length, "second, admitted once the first released its slots");
            eq(1, fake.maxBound.get(), "never both bound");
        }
        log.add("ok");
    }

    @Scenario
    public static void abortQueuedAndRunning(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        fake.gate = new CountDownLatch(1);
        try (InferenceEngine engine = new InferenceEngine(fake, 1)) {
            Events queuedEvents = new Events();
            GenerationHandle running = engine.submit(tokens(new int[] {1}, 40, null));
            GenerationHandle queued = engine.submit(tokens(new int[] {9}, 40, queuedEvents));
            check(fake.decoding.await(TIMEOUT_S, TimeUnit.SECONDS), "the first request decodes");
            eq(1, engine.queueSize(), "one queued");
            eq(1, engine.inFlight(), "one in flight");
            queued.abort();
            running.abort();
            check(running.isAborted() && queued.isAborted(), "aborted");
            fake.gate.countDown();
            expect(CancellationException.class, null, () -> running.future().join());
            expect(CancellationException.class, null, () -> queued.future().join());
            eventually(() -> fake.bound.isEmpty() && engine.inFlight() == 0, "the running request evicted");
            eq(1, fake.evicted.get(), "evicted");
            eq(List.of(1), fake.bindOrder, "the queued request was never bound");
            eq(0, queuedEvents.events.size(), "no events for the queued one");
            eq(0, engine.queueSize(), "queue empty");
        }
        log.add("ok");
    }

    @Scenario
    public static void admissionTimeoutFailsAWaitingRequest(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        fake.gate = new CountDownLatch(1);
        try (InferenceEngine engine = new InferenceEngine(fake, 1, 1, 64, 100)) {
            eq(100, engine.admissionTimeoutMs(), "admissionTimeoutMs");
            GenerationHandle first = engine.submit(tokens(new int[] {1}, 3, null));
            check(fake.decoding.await(TIMEOUT_S, TimeUnit.SECONDS), "the first request decodes");
            GenerationHandle late = engine.submit(tokens(new int[] {2}, 3, null));
            ExecutionException e = expect(ExecutionException.class, "admission timeout",
                    () -> late.future().get(TIMEOUT_S, TimeUnit.SECONDS));
            check(e.getCause() instanceof IllegalStateException, "IllegalStateException: " + e.getCause());
            fake.gate.countDown();
            eq(3, await(first).completionTokens().length, "the running request is unaffected");
            eq(List.of(1), fake.bindOrder, "the late request was never bound");
        }
        log.add("ok");
    }

    @Scenario
    public static void countersAndAListenerThatThrows(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        fake.decodeSleepMs = 2;
        try (InferenceEngine engine = new InferenceEngine(fake, 2)) {
            RuntimeException boom = new RuntimeException("boom");
            GenerationHandle bad = engine.submit(tokens(new int[] {1}, 5, new GenerationListener() {
                @Override public void onGeneratedTokens(int n) { throw boom; }
            }));
            GenerationHandle good = engine.submit(tokens(new int[] {2}, 5, null));
            ExecutionException e = expect(ExecutionException.class, "boom",
                    () -> bad.future().get(TIMEOUT_S, TimeUnit.SECONDS));
            check(e.getCause() == boom, "the listener's exception");
            eq(5, await(good).completionTokens().length, "the other request completes");
            eventually(() -> engine.inFlight() == 0 && engine.activeDecodeCount() == 0, "idle");
            eq(1, engine.completedCount(), "completed");
            check(engine.decodeMsTotal() >= 4, "decode time counted: " + engine.decodeMsTotal());
            check(engine.prefillMsTotal() >= 0 && engine.queueWaitMsTotal() >= 0, "prefill and queue times");
            eq(-1, engine.kvFreeSlots(), "no pool");
            eq(-1, engine.kvFreePages(), "no pool");
            eq(1, fake.evicted.get(), "the failed request was evicted");
            engine.setMaxSpeculativeConcurrency(3);
            eq(3, engine.maxSpeculativeConcurrency(), "recorded");
        }
        log.add("ok");
    }

    @Scenario
    public static void seededSamplingRepeatsAndTinyToppIsGreedy(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        try (InferenceEngine engine = new InferenceEngine(fake, 4)) {
            int[] p = {3};
            int[] a = await(engine.submit(GenerationRequest.ofTokens(p, 8, 50.0, 1.0, true, 42, null)))
                    .completionTokens();
            int[] b = await(engine.submit(GenerationRequest.ofTokens(p, 8, 50.0, 1.0, false, 42, null)))
                    .completionTokens();
            eq(a, b, "same seed, same tokens");
            ChatCompletion tiny = await(engine.submit(GenerationRequest.ofTokens(p, 4, 50.0, 1e-9, true, 7, null)));
            eq(new int[] {4, 5, 6, 7}, tiny.completionTokens(), "a tiny nucleus keeps the argmax");
            check(tiny.logprobs() != null && tiny.logprobs().length == 4 && tiny.logprobs()[0] <= 0,
                    "logprobs when asked");
        }
        log.add("ok");
    }

    @Scenario
    public static void badRequestsAndSettingsAreRefused(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        expect(IllegalArgumentException.class, "maxInFlight", () -> new InferenceEngine(fake, 0));
        expect(IllegalArgumentException.class, "maxDecodeBatch", () -> new InferenceEngine(fake, 2, 0, 8, 0));
        expect(IllegalArgumentException.class, "prefillTokenBudget", () -> new InferenceEngine(fake, 2, 2, 0, 0));
        expect(NullPointerException.class, "executor", () -> new InferenceEngine(null, 2));
        try (InferenceEngine engine = new InferenceEngine(fake, 2)) {
            expect(IllegalArgumentException.class, "request", () -> engine.submit(null));
            expect(IllegalArgumentException.class, "maxGenLen", () -> engine.submit(tokens(new int[] {1}, -1, null)));
            expect(IllegalArgumentException.class, "empty", () -> engine.submit(tokens(new int[0], 1, null)));
            expect(IllegalArgumentException.class, "maxSeqLen", () -> engine.submit(tokens(new int[65], 1, null)));
            expect(IllegalArgumentException.class, "topp",
                    () -> engine.submit(GenerationRequest.ofTokens(new int[] {1}, 1, 0, 0, false, 0, null)));
            expect(IllegalArgumentException.class, "temperature",
                    () -> engine.submit(GenerationRequest.ofTokens(new int[] {1}, 1, -1, 1, false, 0, null)));
            expect(IllegalArgumentException.class, "neither",
                    () -> engine.submit(new GenerationRequest(null, null, 1, 0, 1, false, 0, null)));
            eq(0, engine.queueSize(), "nothing queued");
            ChatCompletion d = await(engine.submit(GenerationRequest.ofDialog(
                    new Message[] {Message.user("hi")}, 2, 0, 1, false, 0, null)));
            eq(new int[] {1, 2}, d.promptTokens(), "a dialog is rendered by the model's encodeChat");
        }
        log.add("ok");
    }

    @Scenario
    public static void closeFailsUnfinishedRequests(List<String> log) throws Exception {
        // 900 tokens at 5 ms each: still running when close() comes, however loaded the machine
        Fake fake = new Fake(1000, 1000);
        fake.decodeSleepMs = 5;
        InferenceEngine engine = new InferenceEngine(fake, 1);
        GenerationHandle running = engine.submit(tokens(new int[] {1}, 900, null));
        GenerationHandle queued = engine.submit(tokens(new int[] {2}, 900, null));
        check(fake.decoding.await(TIMEOUT_S, TimeUnit.SECONDS), "decoding");
        engine.close();
        engine.close();
        for (GenerationHandle h : List.of(running, queued)) {
            ExecutionException e = expect(ExecutionException.class, "closed",
                    () -> h.future().get(TIMEOUT_S, TimeUnit.SECONDS));
            check(e.getCause() instanceof IllegalStateException, "IllegalStateException: " + e.getCause());
        }
        expect(IllegalStateException.class, "closed", () -> engine.submit(tokens(new int[] {1}, 1, null)));
        eventually(() -> fake.bound.isEmpty(), "the running request evicted");
        eq(1, fake.evicted.get(), "evicted on close");
        log.add("ok");
    }

    @Scenario
    public static void withoutTheStepApiRequestsRunThroughGenerate(List<String> log) throws Exception {
        Fake fake = new Fake(1000, 64);
        fake.stepApi = false;
        try (InferenceEngine engine = new InferenceEngine(fake, 2)) {
            eq(new int[] {4, 5, 6}, await(engine.submit(tokens(new int[] {3}, 3, null))).completionTokens(),
                    "generate's tokens");
            eq(1, fake.generateCalls.get(), "one generate call");
            eq(0, fake.bindOrder.size(), "no step calls");
        }
        log.add("ok");
    }

    // ------------------------------------------------------------------ the bridged Python model

    static PythonLanguageModel lm() {
        return Bridge.languageModel();
    }

    static int[] prompt(int i) {
        return lm().encode("class Engine" + i + ":\n    def ");
    }

    @Scenario
    public static void bridgedConcurrentSubmitsEqualGreedyGenerate(List<String> log) throws Exception {
        int n = 8;
        int[][] solo = new int[n][];
        for (int i = 0; i < n; i++) solo[i] = lm().generate(prompt(i), newTokens, 0, 1, false, 0, null)
                .completionTokens();
        try (InferenceEngine engine = new InferenceEngine(lm().executor(), 4)) {
            check(engine.model() == lm(), "model() is the bridged model");
            GenerationHandle[] hs = new GenerationHandle[n];
            Thread[] threads = new Thread[n];
            CountDownLatch start = new CountDownLatch(1);
            for (int i = 0; i < n; i++) {
                int k = i;
                threads[i] = new Thread(() -> {
                    try {
                        start.await(TIMEOUT_S, TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                        return;
                    }
                    hs[k] = engine.submit(tokens(prompt(k), newTokens, null));
                });
                threads[i].start();
            }
            start.countDown();
            for (Thread t : threads) t.join(TimeUnit.SECONDS.toMillis(TIMEOUT_S));
            for (int i = 0; i < n; i++) {
                ChatCompletion c = await(hs[i]);
                eq(solo[i], c.completionTokens(), "request " + i + " equals its greedy generate");
                eq(lm().name(), c.model(), "model name");
            }
            eq(n, engine.completedCount(), "completed");
            check(engine.kvFreePages() > 0 && engine.kvFreeSlots() > 0, "pool counters");
            check(engine.queueWaitMsTotal() >= 0 && engine.prefillMsTotal() >= 0 && engine.decodeMsTotal() >= 0,
                    "timing counters");
        }
        AsyncScenarios.assertPoolClean("after the bridged engine");
        log.add("requests=" + n);
    }

    @Scenario
    public static void bridgedDialogRequestsEqualChat(List<String> log) throws Exception {
        PythonLanguageModel cm = Bridge.get("chatModel", PythonLanguageModel.class);
        Message[] dialog = {Message.system("you are terse"), Message.user("name a prime number")};
        ChatCompletion want = cm.chat(dialog, newTokens, 0, 1, false, 0, null);
        try (InferenceEngine engine = cm.engine(2)) {
            ChatCompletion got = await(engine.submit(GenerationRequest.ofDialog(dialog, newTokens, 0, 1, false, 0,
                    null)));
            eq(want.promptTokens(), got.promptTokens(), "the dialog rendered by the chat template");
            eq(want.completionTokens(), got.completionTokens(), "tokens equal chat()");
            eq(want.content(), got.content(), "content equals chat()");
        }
        log.add("ok");
    }

    @Scenario
    public static void bridgedAdmissionTimeoutAbortAndClose(List<String> log) throws Exception {
        ModelExecutor ex = lm().executor();
        // the step API works (ExecutorScenarios), yet the engine serves on the Python serving loop
        check(ex.supportsStepApi(), "the step API");
        check(ex.stopTokens().length > 0, "stop tokens");
        expect(IllegalArgumentException.class, "requestIds[0]", () -> ex.decodeStep(new int[] {987654},
                new int[] {1}, new int[] {0}));
        InferenceEngine engine = new InferenceEngine(ex, 1, 1, 2048, 20);
        try {
            CountDownLatch started = new CountDownLatch(1);
            GenerationHandle longOne = engine.submit(tokens(prompt(1), 400, new GenerationListener() {
                @Override public void onGeneratedTokens(int n) { started.countDown(); }
            }));
            check(started.await(TIMEOUT_S, TimeUnit.SECONDS), "the first request runs");
            GenerationHandle late = engine.submit(tokens(prompt(2), 4, null));
            ExecutionException e = expect(ExecutionException.class, "admission timeout",
                    () -> late.future().get(TIMEOUT_S, TimeUnit.SECONDS));
            check(e.getCause() instanceof IllegalStateException, "IllegalStateException: " + e.getCause());
            longOne.abort();
            expect(CancellationException.class, null, () -> longOne.future().join());
            AsyncScenarios.assertPoolClean("when abort returns");
            GenerationHandle open = engine.submit(tokens(prompt(3), 400, null));
            engine.close();
            ExecutionException closed = expect(ExecutionException.class, "closed",
                    () -> open.future().get(TIMEOUT_S, TimeUnit.SECONDS));
            check(closed.getCause() instanceof IllegalStateException, "IllegalStateException on close");
        } finally {
            engine.close();
        }
        expect(IllegalStateException.class, "closed", () -> engine.submit(tokens(prompt(0), 1, null)));
        AsyncScenarios.assertPoolClean("after close");
        try (InferenceEngine again = lm().engine(2)) {  // the model takes a new engine after close
            eq(InferenceEngine.DEFAULT_PREFILL_TOKEN_BUDGET, again.prefillTokenBudget(), "default budget");
        }
        log.add("ok");
    }
}
