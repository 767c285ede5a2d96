package smilestyle;

import java.util.Arrays;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CountDownLatch;
import smile.llm.ChatCompletion;
import smile.llm.FinishReason;
import smile.llm.GenerationListener;
import smile.llm.LanguageModel;
import smile.llm.Message;

/**
 * Application code that knows only Smile's {@code smile.llm} names ({@link LanguageModel}, {@link Message},
 * {@link ChatCompletion}, {@link FinishReason}, {@link GenerationListener}): it works on any model, the bridge's
 * Python-backed one or {@link EchoLanguageModel}. Each method checks what Smile's contract promises and throws
 * {@link AssertionError} naming what differed.
 */
public final class SmileLlmClient {
    private SmileLlmClient() {}

    private static void expect(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    /** Collects the streamed text and the generated-token count. */
    static final class Collector implements GenerationListener {
        final StringBuilder text = new StringBuilder();
        int generated;
        int input = -1;

        @Override public void onInputTokens(int count) { input = count; }
        @Override public void onGeneratedTokens(int count) { generated += count; }
        @Override public void onText(String chunk) { text.append(chunk); }
    }

    /**
     * Greedy {@code generate} through both of Smile's forms (with and without a cancel supplier that never fires),
     * which must agree; the listener's text and counts must match the completion.
     */
    public static ChatCompletion generate(LanguageModel lm, int[] prompt, int maxGenLen, boolean logprobs) {
        Collector l = new Collector();
        ChatCompletion c = lm.generate(prompt, maxGenLen, 0.0, 1.0, logprobs, 0L, l);
        ChatCompletion again = lm.generate(prompt, maxGenLen, 0.0, 1.0, logprobs, 0L, null, () -> false);
        expect(Arrays.equals(c.completionTokens(), again.completionTokens()), "the two generate forms differ");
        expect(c.model().equals(lm.name()), "model " + c.model() + " is not name() " + lm.name());
        expect(Arrays.equals(prompt, c.promptTokens()), "promptTokens differ from the prompt");
        expect(c.content().equals(l.text.toString()), "the listener's text differs from content()");
        expect(l.generated == c.completionTokens().length, "onGeneratedTokens counted " + l.generated);
        expect(l.input == prompt.length, "onInputTokens(" + l.input + ")");
        expect(c.completionTokens().length <= maxGenLen, "more than maxGenLen tokens");
        expect(c.reason() == FinishReason.stop || c.reason() == FinishReason.length, "reason " + c.reason());
        expect((c.logprobs() != null) == logprobs, "logprobs " + (c.logprobs() == null ? "missing" : "present"));
        expect(!lm.family().isEmpty() && lm.maxSeqLen() > 0, "family() or maxSeqLen()");
        return c;
    }

    /** Smile's {@code chat}, which must equal {@code generate} on {@code encodeChat} of the same dialog. */
    public static ChatCompletion chat(LanguageModel lm, int maxGenLen, Message... dialog) {
        ChatCompletion c = lm.chat(dialog, maxGenLen, 0.0, 1.0, false, 0L, null);
        int[] prompt = lm.encodeChat(dialog);
        expect(Arrays.equals(prompt, c.promptTokens()), "chat's prompt is not encodeChat's");
        ChatCompletion g = lm.generate(prompt, maxGenLen, 0.0, 1.0, false, 0L, null);
        expect(Arrays.equals(g.completionTokens(), c.completionTokens()), "chat is not generate on encodeChat");
        expect(c.equals(new ChatCompletion(c.model(), c.content(), c.promptTokens(), c.completionTokens(), c.reason(),
                c.logprobs())), "record equality");
        return c;
    }

    /**
     * {@code generate} cancelled once the supplier has answered false {@code pollsBeforeCancel} times: it must end
     * with {@link CancellationException}; returns its message.
     */
    public static String cancel(LanguageModel lm, int[] prompt, int maxGenLen, int pollsBeforeCancel) {
        int[] polls = {0};
        try {
            ChatCompletion c = lm.generate(prompt, maxGenLen, 0.0, 1.0, false, 0L, null,
                    () -> polls[0]++ >= pollsBeforeCancel);
            throw new AssertionError("generate returned " + c.completionTokens().length + " tokens instead of "
                    + "being cancelled");
        } catch (CancellationException e) {
            expect(polls[0] == pollsBeforeCancel + 1, "the supplier was polled " + polls[0] + " times");
            return e.getMessage();
        }
    }

    /**
     * Each prompt's greedy tokens from one thread, one prompt after another, then from one thread per prompt, all
     * released at once: every thread must get its single-thread output. Returns the tokens in prompt order.
     */
    public static int[][] concurrentGreedy(LanguageModel lm, int[][] prompts, int maxGenLen) throws Exception {
        int n = prompts.length;
        int[][] alone = new int[n][];
        for (int i = 0; i < n; i++) alone[i] = lm.generate(prompts[i], maxGenLen, 0.0, 1.0, false, 0L, null)
                .completionTokens();
        int[][] out = new int[n][];
        Throwable[] errors = new Throwable[n];
        CountDownLatch start = new CountDownLatch(1);
        Thread[] threads = new Thread[n];
        for (int i = 0; i < n; i++) {
            int row = i;
            threads[i] = new Thread(() -> {
                try {
                    start.await();
                    out[row] = lm.generate(prompts[row], maxGenLen, 0.0, 1.0, false, 0L, null).completionTokens();
                } catch (Throwable t) {
                    errors[row] = t;
                }
            }, "smile-client-" + i);
            threads[i].setDaemon(true);
            threads[i].start();
        }
        start.countDown();
        for (int i = 0; i < n; i++) {
            threads[i].join(120_000);
            expect(!threads[i].isAlive(), "thread " + i + " did not finish within two minutes");
            if (errors[i] != null) throw new AssertionError("thread " + i + " threw " + errors[i], errors[i]);
            expect(Arrays.equals(alone[i], out[i]), "thread " + i + ": " + Arrays.toString(out[i])
                    + " differs from its single-thread output " + Arrays.toString(alone[i]));
        }
        return out;
    }

    /**
     * Every check above on {@link EchoLanguageModel}, plus the routing of Smile's default methods: the short forms
     * call the full ones with a null supplier.
     */
    public static String checkEcho() throws Exception {
        EchoLanguageModel echo = new EchoLanguageModel();
        int[] prompt = "hello".chars().toArray();
        ChatCompletion c = generate(echo, prompt, 3, true);
        expect(c.content().equals("oll") && c.reason() == FinishReason.length, "echo generate: " + c);
        ChatCompletion d = chat(echo, 100, Message.system("be brief"), Message.user("hi"));
        expect(d.reason() == FinishReason.stop && d.content().startsWith(" :tnatsissa"), "echo chat: " + d.content());
        String cancelled = cancel(echo, prompt, 5, 2);
        expect(cancelled.equals("cancelled after 2 tokens"), cancelled);
        int[][] rows = {prompt, "world".chars().toArray(), "smile".chars().toArray()};
        concurrentGreedy(echo, rows, 4);
        return String.join(",", echo.calls().subList(0, 6));
    }
}
