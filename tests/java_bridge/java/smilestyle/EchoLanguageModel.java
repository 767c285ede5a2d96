package smilestyle;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.function.BooleanSupplier;
import smile.llm.ChatCompletion;
import smile.llm.FinishReason;
import smile.llm.GenerationListener;
import smile.llm.LanguageModel;
import smile.llm.Message;

/**
 * A toy model written against Smile's {@code smile.llm.LanguageModel} exactly as Smile declares it: it implements
 * Smile's abstract members and nothing else (the two short {@code generate}/{@code chat} forms are the interface's
 * default methods), so it compiles only while the bridge's interface has no other abstract member and the same
 * signatures. Tokens are UTF-16 code units; a dialog renders as {@code "role: content\n"} lines and an open
 * {@code "assistant: "}; generation echoes the prompt backwards, one code unit per step.
 */
public final class EchoLanguageModel implements LanguageModel {
    private final List<String> calls = new ArrayList<>();

    /** The abstract methods called so far, in order (the default methods show up as the ones they call). */
    public synchronized List<String> calls() {
        return new ArrayList<>(calls);
    }

    private synchronized void called(String what) {
        calls.add(what);
    }

    @Override
    public String family() {
        return "test/echo";
    }

    @Override
    public String name() {
        return "echo";
    }

    @Override
    public int maxSeqLen() {
        return 256;
    }

    @Override
    public int[] encodeChat(Message... dialog) {
        called("encodeChat");
        if (dialog == null || dialog.length == 0) throw new IllegalArgumentException("dialog must not be empty");
        StringBuilder text = new StringBuilder();
        for (Message m : dialog) text.append(m.role().name()).append(": ").append(m.content()).append('\n');
        text.append("assistant: ");
        return text.chars().toArray();
    }

    @Override
    public ChatCompletion generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean logprobs,
                                   long seed, GenerationListener listener, BooleanSupplier cancelRequested) {
        called(cancelRequested == null ? "generate" : "generate+cancel");
        if (prompt == null) throw new IllegalArgumentException("prompt must not be null");
        if (listener != null) {
            listener.onInputTokens(prompt.length);
            listener.onCachedInputTokens(0);
        }
        int n = Math.min(maxGenLen, prompt.length);
        int[] out = new int[n];
        StringBuilder text = new StringBuilder();
        for (int i = 0; i < n; i++) {
            if (cancelRequested != null && cancelRequested.getAsBoolean()) {
                throw new CancellationException("cancelled after " + i + " tokens");
            }
            out[i] = prompt[prompt.length - 1 - i];
            text.append((char) out[i]);
            if (listener != null) {
                listener.onGeneratedTokens(1);
                listener.onText(String.valueOf((char) out[i]));
            }
        }
        FinishReason reason = n < maxGenLen ? FinishReason.stop : FinishReason.length;
        return new ChatCompletion(name(), text.toString(), prompt.clone(), out, reason, logprobs ? new float[n] : null);
    }

    @Override
    public ChatCompletion chat(Message[] dialog, int maxGenLen, double temperature, double topp, boolean logprobs,
                               long seed, GenerationListener listener, BooleanSupplier cancelRequested) {
        called(cancelRequested == null ? "chat" : "chat+cancel");
        return generate(encodeChat(dialog), maxGenLen, temperature, topp, logprobs, seed, listener, cancelRequested);
    }
}
