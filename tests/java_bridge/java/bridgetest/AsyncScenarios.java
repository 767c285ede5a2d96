package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Flow;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import smile.llm.Completion;
import smile.llm.GenerationListener;
import smile.llm.cache.KvCachePool;
import smile.llm.engine.GenerationHandle;
import smile.llm.engine.GenerationRequest;
import smile.llm.engine.InferenceEngine;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * The asynchronous API from Java: {@code submit} futures, cancellation, the engine's handle and settings, and
 * {@code stream} publishers, against the same requests' synchronous greedy output. Every scenario ends with the
 * pool audited: nothing bound, every page free or held by the prefix tree.
 */
public final class AsyncScenarios {
    private AsyncScenarios() {}

    /** New tokens per request (set from the test's scale). */
    public static int newTokens = 8;

    private static final long TIMEOUT_S = 60;

    static PythonLanguageModel lm() {
        return Bridge.languageModel();
    }

    static int[] prompt(int i) {
        return lm().encode("def handler_" + i + "(request):\n    ");
    }

    static int[] solo(int[] prompt, int n) {
        return lm().generate(prompt, n, 0.0, 1.0, false, 0, null).completionTokens();
    }

    /** Nothing bound, the pool consistent, every page free or cached. */
    static void assertPoolClean(String when) {
        KvCachePool pool = lm().kvCachePool();
        pool.checkInvariants();
        eq(0, pool.boundRequestCount(), "bound requests " + when);
        eq(pool.numSlots() / pool.pageSize(), pool.freePages() + pool.radixCache().totalSize() / pool.pageSize(),
                "free plus cached pages " + when);
    }

    /** Records events, the threads they arrive on, and whether the future was done at each. */
    static final class Recorder implements GenerationListener {
        final List<String> events = Collections.synchronizedList(new ArrayList<>());
        final StringBuilder text = new StringBuilder();
        final List<String> threads = Collections.synchronizedList(new ArrayList<>());
        volatile CompletableFuture<Completion> future;
        volatile boolean eventAfterDone;

        private void seen(String e) {
            events.add(e);
            threads.add(Thread.currentThread().getName());
            CompletableFuture<Completion> f = future;
            if (f != null && f.isDone()) eventAfterDone = true;
        }

        @Override public void onInputTokens(int n) { seen("in:" + n); }
        @Override public void onCachedInputTokens(int n) { seen("cache:" + n); }
        @Override public void onGeneratedTokens(int n) { seen("gen:" + n); }
        @Override public synchronized void onText(String chunk) { seen("text:" + chunk); text.append(chunk); }
    }

    static Completion await(CompletableFuture<Completion> f) throws Exception {
        return f.get(TIMEOUT_S, TimeUnit.SECONDS);
    }

    @Scenario
    public static void futuresFromOneThreadEqualSolo(List<String> log) throws Exception {
        int n = 12;
        int[][] prompts = new int[n][];
        int[][] solo = new int[n][];
        for (int i = 0; i < n; i++) {
            prompts[i] = prompt(i);
            solo[i] = solo(prompts[i], newTokens);
        }
        Recorder[] recorders = new Recorder[n];
        List<CompletableFuture<Completion>> futures = new ArrayList<>();
        List<CompletableFuture<String>> textAtCompletion = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            recorders[i] = new Recorder();
            CompletableFuture<Completion> f = lm().submit(prompts[i], newTokens, 0.0, 1.0, false, 0, recorders[i]);
            recorders[i].future = f;
            futures.add(f);
            Recorder r = recorders[i];
            textAtCompletion.add(f.thenApply(c -> r.text.toString()));  // the listener has finished by then
        }
        for (int i = 0; i < n; i++) {
            Completion c = await(futures.get(i));
            Recorder r = recorders[i];
            eq(solo[i], c.tokens(), "request " + i + " tokens equal its solo greedy output");
            eq(c.text(), textAtCompletion.get(i).get(TIMEOUT_S, TimeUnit.SECONDS), "request " + i
                    + ": every onText was delivered before the future completed");
            eq("in:" + prompts[i].length, r.events.get(0), "first event");
            check(!r.eventAfterDone, "no event after the future completed");
            for (String t : r.threads) {
                check(t.startsWith("smile-llm-delivery-"), "listener ran on a delivery thread, not " + t);
            }
        }
        assertPoolClean("after 12 futures");
        log.add("requests=" + n);
    }

    @Scenario
    public static void cancelRunningFreesPagesOnReturn(List<String> log) throws Exception {
        CountDownLatch started = new CountDownLatch(1);
        AtomicInteger texts = new AtomicInteger();
        GenerationListener l = new GenerationListener() {
            @Override public void onText(String chunk) {
                texts.incrementAndGet();
                started.countDown();
            }
        };
        CompletableFuture<Completion> f = lm().submit(prompt(1), 200, 0.0, 1.0, false, 0, l);
        check(started.await(TIMEOUT_S, TimeUnit.SECONDS), "the request started");
        check(f.cancel(true), "cancel of a running request returns true");
        assertPoolClean("when cancel returns");
        int seen = texts.get();
        check(f.isCancelled() && f.isDone(), "the future is cancelled");
        expect(CancellationException.class, null, f::join);
        check(!f.cancel(true), "a second cancel returns false");
        Thread.sleep(100);
        eq(seen, texts.get(), "no text after cancel returned");
        log.add("texts before cancel=" + seen);
    }

    @Scenario
    public static void listenerThatThrowsFailsOnlyItsRequest(List<String> log) throws Exception {
        RuntimeException boom = new RuntimeException("boom from a listener");
        int[][] prompts = {prompt(2), prompt(3), prompt(4)};
        int[][] solo = {solo(prompts[0], newTokens), null, solo(prompts[2], newTokens)};
        GenerationListener throwing = new GenerationListener() {
            @Override public void onGeneratedTokens(int n) { throw boom; }
        };
        List<CompletableFuture<Completion>> fs = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            fs.add(lm().submit(prompts[i], newTokens, 0.0, 1.0, false, 0, i == 1 ? throwing : null));
        }
        ExecutionException e = expect(ExecutionException.class, "boom", () -> await(fs.get(1)));
        check(e.getCause() == boom, "the future fails with the listener's own exception");
        eq(solo[0], await(fs.get(0)).tokens(), "request 0 unaffected");
        eq(solo[2], await(fs.get(2)).tokens(), "request 2 unaffected");
        assertPoolClean("after a listener failed");
        log.add("failed with " + e.getCause());
    }

    @Scenario
    public static void badInputIsRefusedAtSubmitNothingQueued(List<String> log) {
        int vocab = lm().vocabSize();
        expect(IllegalArgumentException.class, "maxGenLen", () -> lm().submit(prompt(0), -1, 0, 1, false, 0, null));
        expect(IllegalArgumentException.class, "maxGenLen",
                () -> lm().generate(prompt(0), -1, 0, 1, false, 0, null));
        expect(IllegalArgumentException.class, "maxGenLen", () -> lm().stream(prompt(0), -1, 0, 1, 0));
        expect(IllegalArgumentException.class, "topp", () -> lm().submit(prompt(0), 4, 0, 0, false, 0, null));
        expect(IllegalArgumentException.class, "vocabulary",
                () -> lm().submit(new int[] {1, vocab}, 4, 0, 1, false, 0, null));
        expect(IllegalArgumentException.class, "prompt", () -> lm().submit(null, 4, 0, 1, false, 0, null));
        try (InferenceEngine engine = lm().engine(2)) {
            expect(IllegalArgumentException.class, "maxGenLen",
                    () -> engine.submit(GenerationRequest.ofTokens(prompt(0), -5, 0, 1, false, 0, null)));
            expect(IllegalArgumentException.class, "request", () -> engine.submit(null));
            eq(0, engine.queueSize(), "nothing queued");
        }
        expect(IllegalArgumentException.class, "promptTokens",
                () -> GenerationRequest.ofTokens(null, 4, 0, 1, false, 0, null));
        assertPoolClean("after refused requests");
        log.add("refused");
    }

    @Scenario
    public static void engineSettingsBoundTheBatchAndAbortFrees(List<String> log) throws Exception {
        expect(IllegalArgumentException.class, "maxInFlight", () -> lm().engine(0));
        expect(IllegalArgumentException.class, "prefillTokenBudget", () -> lm().engine(2, 0));
        int n = 6;
        int[][] prompts = new int[n][];
        int[][] solo = new int[n][];
        for (int i = 0; i < n; i++) {
            prompts[i] = prompt(10 + i);
            solo[i] = solo(prompts[i], newTokens);
        }
        InferenceEngine engine = lm().engine(2, 16);
        AtomicInteger maxInFlight = new AtomicInteger();
        try {
            eq(2, engine.maxInFlight(), "maxInFlight");
            eq(16, engine.prefillTokenBudget(), "prefillTokenBudget");
            check(engine.model() != null, "model()");
            expect(IllegalStateException.class, "another", () -> lm().engine(2));
            GenerationListener sampler = new GenerationListener() {
                @Override public void onGeneratedTokens(int k) {
                    maxInFlight.accumulateAndGet(engine.inFlight(), Math::max);
                }
            };
            List<GenerationHandle> handles = new ArrayList<>();
            for (int i = 0; i < n; i++) {
                handles.add(engine.submit(GenerationRequest.ofTokens(prompts[i], newTokens, 0, 1, false, 0, sampler)));
            }
            // a long request, aborted while queued or running: its pages are free when abort returns
            GenerationHandle longOne = engine.submit(GenerationRequest.ofTokens(prompt(99), 200, 0, 1, false, 0,
                    null));
            longOne.abort();
            check(longOne.isAborted() && longOne.future().isCancelled(), "aborted handle's future is cancelled");
            for (int i = 0; i < n; i++) {
                GenerationHandle h = handles.get(i);
                eq(solo[i], h.future().get(TIMEOUT_S, TimeUnit.SECONDS).completionTokens(),
                        "engine request " + i + " equals solo");
                check(h.requestId() > 0, "request id");
            }
            check(maxInFlight.get() >= 1 && maxInFlight.get() <= 2, "at most 2 in flight, saw " + maxInFlight.get());
        } finally {
            engine.close();
        }
        expect(IllegalStateException.class, "shut down",
                () -> engine.submit(GenerationRequest.ofTokens(prompt(0), 4, 0, 1, false, 0, null)));
        try (InferenceEngine again = lm().engine(4)) {  // the model takes a new engine after close
            eq(InferenceEngine.DEFAULT_PREFILL_TOKEN_BUDGET, again.prefillTokenBudget(), "default budget");
        }
        assertPoolClean("after the engine");
        log.add("max in flight=" + maxInFlight.get());
    }

    @Scenario
    public static void cancelQueuedRequestNeverStarts(List<String> log) throws Exception {
        try (InferenceEngine engine = lm().engine(1)) {
            CountDownLatch running = new CountDownLatch(1);
            GenerationListener first = new GenerationListener() {
                @Override public void onText(String chunk) { running.countDown(); }
            };
            Recorder queued = new Recorder();
            GenerationHandle a = engine.submit(GenerationRequest.ofTokens(prompt(5), 60, 0, 1, false, 0, first));
            GenerationHandle b = engine.submit(GenerationRequest.ofTokens(prompt(6), 60, 0, 1, false, 0, queued));
            check(running.await(TIMEOUT_S, TimeUnit.SECONDS), "the first request runs");
            check(b.future().cancel(true), "cancel the queued request through its future");
            expect(CancellationException.class, null, () -> b.future().join());
            a.abort();
            expect(CancellationException.class, null, () -> a.future().join());
            eq(0, queued.events.size(), "the cancelled queued request never started");
        }
        assertPoolClean("after cancelling queued and running requests");
        log.add("ok");
    }

    /** Subscribes with demand of one chunk at a time, requested from a thread of {@code requester}. */
    static final class OneByOne implements Flow.Subscriber<String> {
        final ExecutorService requester;
        final StringBuilder text = new StringBuilder();
        final CountDownLatch done = new CountDownLatch(1);
        final int cancelAfter;
        volatile Flow.Subscription subscription;
        volatile Throwable error;
        final AtomicInteger terminals = new AtomicInteger();
        final AtomicInteger chunks = new AtomicInteger();

        OneByOne(ExecutorService requester, int cancelAfter) {
            this.requester = requester;
            this.cancelAfter = cancelAfter;
        }

        @Override public void onSubscribe(Flow.Subscription s) {
            subscription = s;
            requester.execute(() -> s.request(1));
        }

        @Override public void onNext(String chunk) {
            check(!chunk.isEmpty(), "chunks are never empty");
            text.append(chunk);
            if (chunks.incrementAndGet() == cancelAfter) {
                subscription.cancel();  // the request's pages are free when this returns
                assertPoolCleanOrBusy();
                done.countDown();
                return;
            }
            requester.execute(() -> subscription.request(1));
        }

        @Override public void onError(Throwable t) {
            error = t;
            terminals.incrementAndGet();
            done.countDown();
        }

        @Override public void onComplete() {
            terminals.incrementAndGet();
            done.countDown();
        }

        private void assertPoolCleanOrBusy() {
            lm().kvCachePool().checkInvariants();
        }
    }

    @Scenario
    public static void streamsFromSeveralThreadsEqualSolo(List<String> log) throws Exception {
        int n = 4;
        ExecutorService requester = Executors.newFixedThreadPool(3);
        try {
            String[] solo = new String[n];
            int[][] prompts = new int[n][];
            for (int i = 0; i < n; i++) {
                prompts[i] = prompt(20 + i);
                solo[i] = lm().generate(prompts[i], newTokens, 0, 1, false, 0, null).content();
            }
            OneByOne[] subs = new OneByOne[n];
            Thread[] subscribers = new Thread[n];
            for (int i = 0; i < n; i++) {
                subs[i] = new OneByOne(requester, -1);
                Flow.Publisher<String> p = lm().stream(prompts[i], newTokens, 0.0, 1.0, 0);
                OneByOne s = subs[i];
                subscribers[i] = new Thread(() -> p.subscribe(s), "subscriber-" + i);
                subscribers[i].start();
            }
            for (int i = 0; i < n; i++) {
                subscribers[i].join();
                check(subs[i].done.await(TIMEOUT_S, TimeUnit.SECONDS), "stream " + i + " completed");
                check(subs[i].error == null, "stream " + i + " error " + subs[i].error);
                eq(1, subs[i].terminals.get(), "one terminal signal");
                eq(solo[i], subs[i].text.toString(), "stream " + i + " text equals solo");
            }
            OneByOne canceller = new OneByOne(requester, 2);
            lm().stream(prompt(30), 200, 0.0, 1.0, 0).subscribe(canceller);
            check(canceller.done.await(TIMEOUT_S, TimeUnit.SECONDS), "cancelled after two chunks");
            eq(2, canceller.chunks.get(), "chunks before cancel");
            Thread.sleep(100);
            eq(2, canceller.chunks.get(), "no chunk after cancel");
            eq(0, canceller.terminals.get(), "no terminal signal after cancel");
        } finally {
            requester.shutdown();
        }
        assertPoolClean("after streams");
        log.add("streams=" + n);
    }

    @Scenario
    public static void streamRulesOneSubscriberAndPositiveDemand(List<String> log) throws Exception {
        ExecutorService requester = Executors.newSingleThreadExecutor();
        try {
            Flow.Publisher<String> p = lm().stream(prompt(40), newTokens, 0.0, 1.0, 0);
            OneByOne first = new OneByOne(requester, -1);
            p.subscribe(first);
            OneByOne second = new OneByOne(requester, -1);
            p.subscribe(second);
            check(second.done.await(TIMEOUT_S, TimeUnit.SECONDS), "second subscriber signalled");
            check(second.error instanceof IllegalStateException, "second subscriber: " + second.error);
            check(first.done.await(TIMEOUT_S, TimeUnit.SECONDS) && first.error == null, "first completes");
            expect(NullPointerException.class, "subscriber", () -> lm().stream(prompt(40), 4, 0, 1, 0).subscribe(null));

            CountDownLatch failed = new CountDownLatch(1);
            Throwable[] got = new Throwable[1];
            lm().stream(prompt(41), 200, 0.0, 1.0, 0).subscribe(new Flow.Subscriber<String>() {
                @Override public void onSubscribe(Flow.Subscription s) { s.request(0); }
                @Override public void onNext(String item) { got[0] = new AssertionError("onNext after request(0)"); }
                @Override public void onError(Throwable t) { got[0] = t; failed.countDown(); }
                @Override public void onComplete() { failed.countDown(); }
            });
            check(failed.await(TIMEOUT_S, TimeUnit.SECONDS), "request(0) signalled");
            check(got[0] instanceof IllegalArgumentException, "request(0) gives IllegalArgumentException: " + got[0]);
        } finally {
            requester.shutdown();
        }
        assertPoolClean("after stream rule checks");
        log.add("ok");
    }
}
