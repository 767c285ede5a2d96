package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;

import java.util.ArrayList;
import java.util.List;
import smile.llm.ChatCompletion;
import smile.llm.Completion;
import smile.llm.FinishReason;
import smile.llm.GenerationListener;
import smile.llm.GenerationListeners;
import smile.llm.LanguageModel;
import smile.llm.SamplingParams;
import smile.llm.python.PythonLanguageModel;

/** Generation from Java through {@code smile.llm.LanguageModel} (Smile's form) and the bridge's, with listeners. */
public final class GenerationDrivers {
    private GenerationDrivers() {}

    /** Records every callback as "event:value". */
    public static final class Recorder implements GenerationListener {
        public final List<String> events = new ArrayList<>();
        public final StringBuilder text = new StringBuilder();
        public int input = -1, cached = -1, generated;

        @Override public void onInputTokens(int n) { events.add("in:" + n); input = n; }
        @Override public void onCachedInputTokens(int n) { events.add("cache:" + n); cached = n; }
        @Override public void onGeneratedTokens(int n) { events.add("gen:" + n); generated += n; }
        @Override public void onThinkingTokens(int n) { events.add("think:" + n); }
        @Override public void onText(String chunk) { events.add("text:" + chunk); text.append(chunk); }
    }

    /** The listener's cached input count of the last {@link #generate} call. */
    public static volatile int lastCached = -1;

    /**
     * Smile's {@code generate} with a recording listener, checking in Java what a listener may rely on: input
     * counts first and once, cached never above input, one generated event per token, the streamed text equal to
     * the completion's, chunks never empty, logprobs one per token when asked.
     */
    public static ChatCompletion generate(PythonLanguageModel lm, int[] prompt, int maxGenLen, double temperature,
                                          long seed, boolean logprobs) {
        Recorder r = new Recorder();
        ChatCompletion c = lm.generate(prompt, maxGenLen, temperature, 1.0, logprobs, seed, r);
        checkEvents(r, prompt);
        eq(c.completionTokens().length, r.generated, "generated events");
        eq(c.content(), r.text.toString(), "listener text equals ChatCompletion.content()");
        eq(prompt, c.promptTokens(), "ChatCompletion.promptTokens()");
        eq(lm.name(), c.model(), "ChatCompletion.model() is name()");
        check(c.completionTokens().length <= maxGenLen, "at most maxGenLen tokens");
        check(c.reason() == FinishReason.stop || c.reason() == FinishReason.length, "reason " + c.reason());
        checkLogprobs(logprobs, c.logprobs(), c.completionTokens().length);
        lastCached = r.cached;
        eq(0, lm.kvCachePool().boundRequestCount(), "generate leaves nothing bound");
        lm.kvCachePool().checkInvariants();
        return c;
    }

    private static void checkEvents(Recorder r, int[] prompt) {
        eq("in:" + prompt.length, r.events.get(0), "first event");
        check(r.events.get(1).startsWith("cache:"), "second event is the cached count: " + r.events.get(1));
        check(r.cached >= 0 && r.cached <= r.input, "cached " + r.cached + " within input " + r.input);
        for (int i = 2; i < r.events.size(); i++) {
            String e = r.events.get(i);
            check(e.startsWith("gen:") || e.startsWith("text:"), "event " + i + " is " + e);
            check(!e.equals("text:"), "empty text chunk at event " + i);
        }
    }

    private static void checkLogprobs(boolean requested, float[] logprobs, int tokens) {
        if (requested) {
            check(logprobs != null, "logprobs requested");
            eq(tokens, logprobs.length, "one logprob per token");
            for (float lp : logprobs) check(lp <= 0f && !Float.isNaN(lp), "logprob " + lp);
        } else {
            check(logprobs == null, "logprobs not requested");
        }
    }

    /**
     * The bridge's {@code generate(prompt, SamplingParams, listener)} with the same settings as {@link #generate}
     * and the same listener checks; its {@code Completion} also carries the stats, whose cached count must be the
     * listener's.
     */
    public static Completion generateWithStats(PythonLanguageModel lm, int[] prompt, int maxGenLen,
                                               double temperature, long seed, boolean logprobs) {
        Recorder r = new Recorder();
        SamplingParams params = SamplingParams.builder().maxNewTokens(maxGenLen).temperature(temperature)
                .seed(seed).logprobs(logprobs).build();
        Completion c = lm.generate(prompt, params, r);
        checkEvents(r, prompt);
        eq(c.tokens().length, r.generated, "generated events");
        eq(c.text(), r.text.toString(), "listener text equals Completion.text()");
        eq(prompt, c.prompt(), "Completion.prompt()");
        check(c.finishReason().equals("stop") || c.finishReason().equals("length"), "finishReason");
        checkLogprobs(logprobs, c.logprobs(), c.tokens().length);
        check(c.statsJson().contains("\"cached_tokens\": " + r.cached + ","),
                "onCachedInputTokens(" + r.cached + ") matches the stats: " + c.statsJson());
        eq(0, lm.kvCachePool().boundRequestCount(), "generate leaves nothing bound");
        lm.kvCachePool().checkInvariants();
        return c;
    }

    /** Smile's GenerationListenersTest: compose fans out in argument order, skipping nulls. */
    public static String[] composeOrder() {
        Recorder a = new Recorder(), b = new Recorder();
        List<String> both = new ArrayList<>();
        GenerationListener tagA = tag("a", both), tagB = tag("b", both);
        GenerationListener l = GenerationListeners.compose(a, null, b, tagA, tagB);
        l.onInputTokens(10);
        l.onCachedInputTokens(4);
        l.onGeneratedTokens(3);
        l.onThinkingTokens(2);
        l.onText("hi");
        List<String> want = List.of("in:10", "cache:4", "gen:3", "think:2", "text:hi");
        eq(want, a.events, "first listener");
        eq(want, b.events, "second listener");
        eq(List.of("a:in:10", "b:in:10", "a:cache:4", "b:cache:4", "a:gen:3", "b:gen:3", "a:think:2",
                "b:think:2", "a:text:hi", "b:text:hi"), both, "argument order per event");
        check(GenerationListeners.compose() == null, "compose() == null");
        check(GenerationListeners.compose((GenerationListener) null) == null, "compose(null) == null");
        check(GenerationListeners.compose((GenerationListener[]) null) == null, "compose((L[]) null) == null");
        check(GenerationListeners.compose(a) == a, "compose(a) == a");
        check(GenerationListeners.compose(null, a, null) == a, "compose(null, a, null) == a");
        return both.toArray(new String[0]);
    }

    private static GenerationListener tag(String name, List<String> out) {
        return new GenerationListener() {
            @Override public void onInputTokens(int n) { out.add(name + ":in:" + n); }
            @Override public void onCachedInputTokens(int n) { out.add(name + ":cache:" + n); }
            @Override public void onGeneratedTokens(int n) { out.add(name + ":gen:" + n); }
            @Override public void onThinkingTokens(int n) { out.add(name + ":think:" + n); }
            @Override public void onText(String chunk) { out.add(name + ":text:" + chunk); }
        };
    }

    /** toPublisher delivers onText chunks (and only those) to the publisher's subscribers. */
    public static String publisherChunks(LanguageModel lm, int[] prompt, int maxGenLen) throws Exception {
        StringBuilder got = new StringBuilder();
        java.util.concurrent.CountDownLatch done = new java.util.concurrent.CountDownLatch(1);
        try (java.util.concurrent.SubmissionPublisher<String> pub = new java.util.concurrent.SubmissionPublisher<>()) {
            pub.consume(got::append).thenRun(done::countDown);
            ChatCompletion c = lm.generate(prompt, maxGenLen, 0.0, 1.0, false, 0L,
                    GenerationListeners.toPublisher(pub));
            pub.close();
            check(done.await(10, java.util.concurrent.TimeUnit.SECONDS), "publisher completed");
            eq(c.content(), got.toString(), "published text");
        }
        return got.toString();
    }

    /**
     * Calls Smile's {@code lm.generate} (greedy) from one Java thread per prompt, all at once, and returns each
     * thread's tokens in prompt order; fails naming the first thread that threw or did not finish within a minute.
     */
    public static int[][] concurrentGreedy(LanguageModel lm, int[][] prompts, int maxGenLen) throws Exception {
        int n = prompts.length;
        int[][] out = new int[n][];
        Throwable[] errors = new Throwable[n];
        java.util.concurrent.CountDownLatch start = new java.util.concurrent.CountDownLatch(1);
        Thread[] threads = new Thread[n];
        for (int i = 0; i < n; i++) {
            final int row = i;
            threads[i] = new Thread(() -> {
                try {
                    start.await();
                    out[row] = lm.generate(prompts[row], maxGenLen, 0.0, 1.0, false, 0L, null).completionTokens();
                } catch (Throwable t) {
                    errors[row] = t;
                }
            }, "generate-" + i);
            threads[i].start();
        }
        start.countDown();
        for (int i = 0; i < n; i++) {
            threads[i].join(60_000);
            check(!threads[i].isAlive(), "thread " + i + " did not finish within a minute");
            if (errors[i] != null) throw new AssertionError("thread " + i + " threw " + errors[i], errors[i]);
        }
        return out;
    }
}
