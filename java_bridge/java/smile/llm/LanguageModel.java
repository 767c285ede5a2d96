package smile.llm;

import java.util.function.BooleanSupplier;

/**
 * A chat-capable decoder language model, member for member Smile's interface: code written against Smile's
 * {@code smile.llm.LanguageModel} (calling it, or implementing it) compiles against the bridge unchanged.
 *
 * <p>The bridge's model, {@link smile.llm.python.Bridge#languageModel()}, is a
 * {@link smile.llm.python.PythonLanguageModel}, which adds tokenization, futures, streams, the
 * {@link SamplingParams} forms and the continuous-batching engine. Its methods are safe from any number of threads
 * at once: concurrent calls are batched on the model's one scheduler, and each returns what it would return alone
 * (greedy).
 *
 * <p>Arguments are checked once, in Python, when a request is made: a bad value is an
 * {@link IllegalArgumentException} naming it, and nothing is queued. Cancellation through {@code cancelRequested}
 * ends the call with {@link java.util.concurrent.CancellationException}, the request's KV released.
 */
public interface LanguageModel {
    /**
     * The label of the model's architecture family. The bridge answers the checkpoint's {@code model_type}
     * ({@code "qwen3"}, {@code "llama"}, {@code "qwen3_5"}, ...); Smile's own models use labels such as
     * {@code "meta/llama3"}.
     */
    String family();

    /** The name of this model instance: the checkpoint folder's name ({@code "default"} for the embedded model). */
    String name();

    /** The most tokens one request may hold, prompt plus completion. */
    int maxSeqLen();

    /**
     * The prompt token ids of {@code dialog} rendered by the model's chat template, with the assistant's turn
     * opened for {@link #generate}. {@link IllegalArgumentException} for a null or empty dialog, a null message, a
     * role the template rejects, or a model without a chat template (the message names the files looked for).
     */
    int[] encodeChat(Message... dialog);

    /** {@link #generate(int[], int, double, double, boolean, long, GenerationListener, BooleanSupplier)} that cannot
     * be cancelled. */
    default ChatCompletion generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean logprobs,
                                    long seed, GenerationListener listener) {
        return generate(prompt, maxGenLen, temperature, topp, logprobs, seed, listener, null);
    }

    /**
     * Up to {@code maxGenLen} new tokens after {@code prompt}.
     *
     * @param prompt the prompt token ids.
     * @param maxGenLen the most new tokens ({@code >= 0}).
     * @param temperature the sampling temperature; 0 is greedy.
     * @param topp the nucleus threshold, in (0, 1].
     * @param logprobs whether the completion carries each new token's log probability.
     * @param seed the random seed; 0 draws a fresh one.
     * @param listener progress callbacks between steps, or null.
     * @param cancelRequested polled between steps, or null: once it answers true the call ends with
     *     {@link java.util.concurrent.CancellationException}.
     * @return the completion, its {@code model} being {@link #name()}.
     */
    ChatCompletion generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean logprobs, long seed,
                            GenerationListener listener, BooleanSupplier cancelRequested);

    /** {@link #chat(Message[], int, double, double, boolean, long, GenerationListener, BooleanSupplier)} that cannot
     * be cancelled. */
    default ChatCompletion chat(Message[] dialog, int maxGenLen, double temperature, double topp, boolean logprobs,
                                long seed, GenerationListener listener) {
        return chat(dialog, maxGenLen, temperature, topp, logprobs, seed, listener, null);
    }

    /**
     * The assistant's reply to {@code dialog}: {@link #generate} on {@link #encodeChat}{@code (dialog)}, with the
     * same arguments and errors as both.
     */
    ChatCompletion chat(Message[] dialog, int maxGenLen, double temperature, double topp, boolean logprobs, long seed,
                        GenerationListener listener, BooleanSupplier cancelRequested);
}
