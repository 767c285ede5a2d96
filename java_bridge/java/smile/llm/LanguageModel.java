package smile.llm;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Flow;
import java.util.function.BooleanSupplier;
import smile.llm.cache.KvCachePool;
import smile.llm.engine.InferenceEngine;

/**
 * A causal language model served from a paged KV pool with prefix reuse (and MTP speculative decoding).
 *
 * <p>Every method is safe from any number of threads at once. Concurrent {@code generate} and {@code submit} calls
 * are batched together on the model's one scheduler, and each returns what it would return alone (greedy). A
 * request is validated once, when it is created: a bad field is an {@link IllegalArgumentException} naming it, and
 * nothing is queued. A negative {@code maxGenLen} is refused (as in Python), never clamped.
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
