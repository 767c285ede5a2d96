package smile.llm.engine;

import smile.llm.LanguageModel;

/**
 * Continuous batching over one {@link LanguageModel}, from {@link LanguageModel#engine(int, int)}: a serving thread
 * admits queued requests while KV pages are free (running ones may be preempted and resumed, with identical output),
 * prefills at most {@link #prefillTokenBudget()} prompt tokens per step and advances up to {@link #maxInFlight()}
 * requests together. The model's {@code generate} and {@code submit} calls from any thread join the same batches.
 * Every method is safe from any thread. {@link #close()} waits for the engine's requests to finish, then detaches it
 * (the model keeps working; its batch size and prefill budget return to their defaults).
 */
public interface InferenceEngine extends AutoCloseable {
    /** The prefill budget of {@link LanguageModel#engine(int)}: prompt tokens per step. */
    int DEFAULT_PREFILL_TOKEN_BUDGET = 1024;

    /**
     * Queues {@code request} and returns at once. {@link IllegalArgumentException} naming the field for a bad
     * request (nothing queued), {@link IllegalStateException} after {@link #close()}.
     */
    GenerationHandle submit(GenerationRequest request);

    /** The model served. */
    LanguageModel model();

    /** The most requests advanced together. */
    int maxInFlight();

    /** The most prompt tokens prefilled per step. */
    int prefillTokenBudget();

    /** Requests queued and not yet admitted (from every caller of the model). */
    int queueSize();

    /** Requests admitted into the KV pool (from every caller of the model). */
    int inFlight();

    /** Free KV slots of the model's pool. */
    int kvFreeSlots();

    /** Free KV pages of the model's pool. */
    int kvFreePages();

    /**
     * Stops accepting requests and detaches the engine. With {@code cancelPending} the engine's queued and running
     * requests are cancelled (pages released); otherwise {@code wait} blocks until they finish. Idempotent.
     */
    void shutdown(boolean wait, boolean cancelPending);

    /** {@code shutdown(true, false)}. */
    @Override
    default void close() {
        shutdown(true, false);
    }
}
