package smile.llm.python;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Flow;
import java.util.stream.Stream;
import smile.llm.Completion;
import smile.llm.GenerationListener;
import smile.llm.LanguageModel;
import smile.llm.SamplingParams;
import smile.llm.TextPublisher;
import smile.llm.TextStream;
import smile.llm.cache.KvCachePool;
import smile.llm.engine.InferenceEngine;
import smile.llm.engine.ModelExecutor;

/**
 * Smile's {@link LanguageModel} served by Python's {@code smile_llm.LanguageModel}, with what the bridge adds:
 * tokenization, futures and streams, every Python sampling field ({@link SamplingParams}) with the richer
 * {@link Completion} (stats, top-k and prompt logprobs, n samples), chat over template dialogs with template
 * variables, the model's KV pool, its {@link ModelExecutor} and a continuous-batching engine.
 * {@link Bridge#languageModel()} returns one.
 *
 * <p>Every method is safe from any number of threads at once. Concurrent {@code generate}, {@code chat} and
 * {@code submit} calls are batched together on the model's one scheduler, and each returns what it would return
 * alone (greedy). A request is validated once, when it is created: a bad field is an
 * {@link IllegalArgumentException} naming it, and nothing is queued. A negative {@code maxGenLen} is refused (as in
 * Python), never clamped.
 */
public interface PythonLanguageModel extends LanguageModel {
    /** Token ids of {@code text}. */
    int[] encode(String text);

    /** The text of {@code tokens}; {@link IllegalArgumentException} for any id outside the vocabulary. */
    String decode(int[] tokens);

    /**
     * Queues a request and returns at once; the model advances it on its serving thread (started when needed, and
     * stopped when idle unless an {@link InferenceEngine} holds it). {@code listener} (may be null) is called in order
     * on a delivery thread, never on the serving thread, and the future completes after its last call. Cancelling
     * the future cancels the request: its KV pages are free when {@code cancel} returns. A listener that throws
     * ends its request and completes the future exceptionally with that exception. Bad input throws
     * {@link IllegalArgumentException} here, before anything is queued. The arguments are those of
     * {@link #generate(int[], int, double, double, boolean, long, GenerationListener)}.
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

    // ------------------------------------------------------------------ chat over template dialogs

    /**
     * Token ids of {@code messages} ({@link smile.llm.Message}s, {@link ChatMessage}s or any other
     * {@link TemplateMessage}) rendered by the model's chat template, exactly as Python's {@code encode_chat} and
     * Hugging Face's {@code apply_chat_template(..., tokenize=True)}: with {@code addGenerationPrompt} the
     * assistant's turn is opened. {@code templateVars} (may be null) are the template's extra variables
     * ({@code "enable_thinking" -> false}, {@code "tools" -> List<Map>}, ...). {@link IllegalArgumentException}
     * naming the message and field for a malformed message, with the template's message when it rejects the
     * conversation, or naming the files looked for when the model has no template.
     */
    int[] encodeChat(List<? extends TemplateMessage> messages, boolean addGenerationPrompt,
                     Map<String, Object> templateVars);

    /** {@code encodeChat(messages, true, null)}. */
    default int[] encodeChat(List<? extends TemplateMessage> messages) {
        return encodeChat(messages, true, null);
    }

    /**
     * The assistant's next turn: {@code generate(encodeChat(messages, true, templateVars), params, listener)}, as
     * Python's {@code chat}. A conversation that grows turn by turn reuses its earlier turns' KV through the prefix
     * cache. The settings are checked first, then the conversation; errors as {@link #encodeChat(List, boolean,
     * Map)} and {@link #generate(int[], SamplingParams, GenerationListener)}.
     */
    Completion chat(List<? extends TemplateMessage> messages, Map<String, Object> templateVars,
                    SamplingParams params, GenerationListener listener);

    /** {@code chat(messages, null, params, null)}. */
    default Completion chat(List<? extends TemplateMessage> messages, SamplingParams params) {
        return chat(messages, null, params, null);
    }

    /** {@code chat(messages, null, params, listener)}. */
    default Completion chat(List<? extends TemplateMessage> messages, SamplingParams params,
                            GenerationListener listener) {
        return chat(messages, null, params, listener);
    }

    // ------------------------------------------------------------------ serving

    /**
     * The model as Smile's {@link ModelExecutor} (the same object every call): its tokens, text and pool. An
     * {@link InferenceEngine} built over it ({@code new InferenceEngine(lm.executor(), ...)}) serves every request on
     * the model's Python serving loop. Its step methods ({@code bind}, {@code prefill}, {@code decodeStep},
     * {@code finish}, {@code evict}) drive the model step by step for code that schedules itself: each runs between
     * the serving loop's steps, on requests the executor bound (the serving loop never sees them).
     */
    ModelExecutor executor();

    /**
     * {@code new InferenceEngine(executor(), maxInFlight, maxInFlight, prefillTokenBudget,
     * InferenceEngine.DEFAULT_ADMISSION_TIMEOUT_MS)}: continuous batching on the model's serving loop, at most
     * {@code maxInFlight} requests running and at most {@code prefillTokenBudget} prompt tokens prefilled per step.
     * {@link IllegalArgumentException} for values below 1, {@link IllegalStateException} while another engine is
     * attached.
     */
    InferenceEngine engine(int maxInFlight, int prefillTokenBudget);

    /** {@code engine(maxInFlight, InferenceEngine.DEFAULT_PREFILL_TOKEN_BUDGET)}. */
    default InferenceEngine engine(int maxInFlight) {
        return engine(maxInFlight, InferenceEngine.DEFAULT_PREFILL_TOKEN_BUDGET);
    }

    /** The model's KV pool. */
    KvCachePool kvCachePool();

    // ------------------------------------------------------------------ registered segments

    /**
     * Computes the KV of {@code text} (a document, a tool description) once, at position 0, and keeps it in the
     * pool until {@link #releaseSegment(Segment)}: requests that name the returned {@link Segment} among their
     * {@link SamplingParams.Builder#segments(Object...)} splice that KV instead of computing it, as Python's
     * {@code register_segment}. {@link smile.llm.cache.KvCacheExhaustedException} when the pool has no room;
     * {@link IllegalArgumentException} for null or empty text, a segment too long for a request, or a model that
     * cannot splice (a hybrid model, whose Gated DeltaNet state a splice cannot give; the message says why).
     */
    Segment registerSegment(String text);

    /** {@link #registerSegment(String)} of token ids. */
    Segment registerSegment(int[] tokens);

    /**
     * Frees a registered segment's KV (its prefix-tree pages become evictable); false when it was already released.
     * A request still waiting to splice it then fails with {@link IllegalArgumentException}.
     * {@link IllegalArgumentException} for null or another model's segment.
     */
    boolean releaseSegment(Segment segment);

    /** The number of token ids. */
    int vocabSize();
}
