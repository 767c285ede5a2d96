package smile.llm;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Flow;
import java.util.function.BooleanSupplier;
import java.util.stream.Stream;
import smile.llm.cache.KvCachePool;
import smile.llm.engine.InferenceEngine;

/**
 * A causal language model served from a paged KV pool with prefix reuse (and MTP speculative decoding).
 *
 * <p>Every method is safe from any number of threads at once. Concurrent {@code generate} and {@code submit} calls
 * are batched together on the model's one scheduler, and each returns what it would return alone (greedy). A
 * request is validated once, when it is created: a bad field is an {@link IllegalArgumentException} naming it, and
 * nothing is queued. A negative {@code maxGenLen} is refused (as in Python), never clamped.
 *
 * <p>Two forms of each generation call: Smile's positional one ({@code maxGenLen, temperature, topp, logprobs,
 * seed}) and one taking {@link SamplingParams}, which covers every Python sampling field (top-k, min-p, penalties,
 * logit bias, stops, top-k logprobs, prompt logprobs, n samples). Chat conversations are rendered by the model's
 * own chat template ({@link #encodeChat}, {@link #chat}).
 */
public interface LanguageModel {
    /** Token ids of {@code text}. */
    int[] encode(String text);

    /** The text of {@code tokens}; {@link IllegalArgumentException} for any id outside the vocabulary. */
    String decode(int[] tokens);

    /**
     * Generates up to {@code maxGenLen} new tokens after {@code prompt}: greedy at temperature 0, nucleus sampling
     * otherwise; seed 0 is nondeterministic. Throws {@link IllegalArgumentException} for tokens outside the
     * vocabulary or bad settings. The listener is called between steps, on whichever thread advances the model.
     */
    default Completion generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean logprobs,
                                long seed, GenerationListener listener) {
        return generate(prompt, maxGenLen, temperature, topp, logprobs, seed, listener, null);
    }

    /**
     * As above; {@code cancelRequested} is polled between steps and ends generation with
     * {@link java.util.concurrent.CancellationException} ("aborted"), the request's KV released.
     */
    Completion generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean logprobs, long seed,
                        GenerationListener listener, BooleanSupplier cancelRequested);

    /**
     * Queues a request and returns at once; the model advances it on its serving thread (started when needed, and
     * stopped when idle unless an {@link InferenceEngine} holds it). {@code listener} (may be null) is called in order
     * on a delivery thread, never on the serving thread, and the future completes after its last call. Cancelling
     * the future cancels the request: its KV pages are free when {@code cancel} returns. A listener that throws
     * ends its request and completes the future exceptionally with that exception. Bad input throws
     * {@link IllegalArgumentException} here, before anything is queued.
     */
    CompletableFuture<Completion> submit(int[] prompt, int maxGenLen, double temperature, double topp,
                                         boolean logprobs, long seed, GenerationListener listener);

    /**
     * The generated text as a {@link Flow.Publisher} of chunks (never empty) for one subscriber: the request is
     * submitted when it subscribes, chunks are emitted as demanded, then {@code onComplete} (or {@code onError}
     * with the request's error). Cancelling the subscription cancels the request and frees its pages. A second
     * subscriber receives {@code onError(IllegalStateException)}.
     */
    default Flow.Publisher<String> stream(int[] prompt, int maxGenLen, double temperature, double topp, long seed) {
        return TextPublisher.of(listener -> submit(prompt, maxGenLen, temperature, topp, false, seed, listener));
    }

    // ------------------------------------------------------------------ SamplingParams forms

    /**
     * Generates after {@code prompt} with {@code params} on the calling thread (batched with every other request
     * of the model), calling {@code listener} (may be null) between steps. {@link IllegalArgumentException} naming
     * the field for a bad value (nothing queued), or when {@code params.n() > 1}: use {@link #generateSamples}.
     */
    Completion generate(int[] prompt, SamplingParams params, GenerationListener listener);

    /** {@code generate(prompt, params, null)}. */
    default Completion generate(int[] prompt, SamplingParams params) {
        return generate(prompt, params, null);
    }

    /**
     * {@code params.n()} samples of {@code prompt}, in order, as Python's {@code generate(..., n=k)}: they share
     * the prompt's KV, computed once. {@link IllegalArgumentException} naming the field for a bad value, nothing
     * queued.
     */
    List<Completion> generateSamples(int[] prompt, SamplingParams params);

    /**
     * {@link #submit(int[], int, double, double, boolean, long, GenerationListener)} with {@code params}: queued at
     * once; cancelling the future cancels the request (its pages are free on return).
     * {@link IllegalArgumentException} for a bad value or {@code params.n() > 1}, nothing queued.
     */
    CompletableFuture<Completion> submit(int[] prompt, SamplingParams params, GenerationListener listener);

    /**
     * {@link #stream(int[], int, double, double, long)} with {@code params}: a {@link Flow.Publisher} of text chunks
     * for one subscriber. Bad input ({@code params.n() > 1} included) throws {@link IllegalArgumentException} here.
     */
    Flow.Publisher<String> stream(int[] prompt, SamplingParams params);

    /**
     * The generated text as a blocking {@link Stream} of chunks (see {@link TextStream}): the request is queued
     * now (bad input throws {@link IllegalArgumentException} here), each element waits for the next chunk, and
     * closing the stream cancels the request and frees its KV pages. Use try-with-resources:
     * {@code try (Stream<String> s = lm.streamText(ids, params)) { s.forEach(System.out::print); }}.
     */
    default Stream<String> streamText(int[] prompt, SamplingParams params) {
        return TextStream.open(listener -> submit(prompt, params, listener));
    }

    // ------------------------------------------------------------------ chat

    /**
     * Token ids of {@code messages} rendered by the model's chat template, exactly as Python's
     * {@code encode_chat} and Hugging Face's {@code apply_chat_template(..., tokenize=True)}: with
     * {@code addGenerationPrompt} the assistant's turn is opened. {@code templateVars} (may be null) are the
     * template's extra variables ({@code "enable_thinking" -> false}, {@code "tools" -> List<Map>}, ...).
     * {@link IllegalArgumentException} naming the message and field for a malformed message, with the template's
     * message when it rejects the conversation, or naming the files looked for when the model has no template.
     */
    int[] encodeChat(List<Message> messages, boolean addGenerationPrompt, Map<String, Object> templateVars);

    /** {@code encodeChat(messages, true, null)}. */
    default int[] encodeChat(List<Message> messages) {
        return encodeChat(messages, true, null);
    }

    /**
     * The assistant's next turn: {@code generate(encodeChat(messages, true, templateVars), params, listener)}, as
     * Python's {@code chat}. A conversation that grows turn by turn reuses its earlier turns' KV through the prefix
     * cache. Errors as {@link #encodeChat} and {@link #generate(int[], SamplingParams, GenerationListener)}.
     */
    Completion chat(List<Message> messages, Map<String, Object> templateVars, SamplingParams params,
                    GenerationListener listener);

    /** {@code chat(messages, null, params, null)}. */
    default Completion chat(List<Message> messages, SamplingParams params) {
        return chat(messages, null, params, null);
    }

    /** {@code chat(messages, null, params, listener)}. */
    default Completion chat(List<Message> messages, SamplingParams params, GenerationListener listener) {
        return chat(messages, null, params, listener);
    }

    // ------------------------------------------------------------------ serving

    /**
     * Attaches a continuous-batching engine with a serving thread: at most {@code maxInFlight} requests run at once
     * and at most {@code prefillTokenBudget} prompt tokens are prefilled per step. {@link IllegalArgumentException}
     * for values below 1, {@link IllegalStateException} while another engine is attached.
     */
    InferenceEngine engine(int maxInFlight, int prefillTokenBudget);

    /** {@code engine(maxInFlight, InferenceEngine.DEFAULT_PREFILL_TOKEN_BUDGET)}. */
    default InferenceEngine engine(int maxInFlight) {
        return engine(maxInFlight, InferenceEngine.DEFAULT_PREFILL_TOKEN_BUDGET);
    }

    /** The model's KV pool. */
    KvCachePool kvCachePool();

    int vocabSize();

    /** The longest prompt plus completion of one request. */
    int maxSeqLen();
}
