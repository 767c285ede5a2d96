package smile.llm.engine;

import java.nio.charset.CharacterCodingException;
import smile.deep.tensor.Tensor;
import smile.llm.LanguageModel;
import smile.llm.cache.KvCachePool;

/**
 * What {@link InferenceEngine} needs of a model, member for member Smile's interface: its tokens and text, and a step
 * API (bind a request into the KV cache, prefill its prompt, decode batches of rows, then finish or evict it). A
 * model whose forward pass is written in Java implements it, and the engine drives the steps itself.
 *
 * <p>The bridged Python model's executor ({@link smile.llm.python.PythonLanguageModel#executor()}) is recognised by
 * the engine, which then hands every request to the model's own Python serving loop instead of driving these steps;
 * its step methods work all the same (they run the Python forward between steps of that serving loop), for code that
 * drives the model step by step.
 *
 * <p>Logits are host {@link Tensor}s: {@code [rows, vocab]} floats, read with {@link Tensor#floatArray()}.
 */
public interface ModelExecutor {
    /** The language model behind the executor (its {@code name()} labels completions). */
    LanguageModel model();

    /** The model's KV pool, or null when it has none (then the engine's KV counters answer -1). */
    KvCachePool kvCachePool();

    /** The padding token id. */
    int padToken();

    /** The ids that end a generation (end of sequence, end of turn); never part of a completion. */
    int[] stopTokens();

    /** The text of {@code tokens}. */
    String decode(int[] tokens);

    /**
     * The text of {@code tokens} for streaming.
     *
     * @throws CharacterCodingException when the tokens end inside a UTF-8 character (the engine retries after the
     *     next token).
     */
    String tryDecode(int[] tokens, boolean skipSpecial) throws CharacterCodingException;

    /**
     * Whether the step methods work. When false, {@link InferenceEngine} runs requests one at a time through
     * {@link LanguageModel#generate} (no batching).
     */
    default boolean supportsStepApi() {
        return true;
    }

    /**
     * Binds one request into the KV pool, reserving {@code totalCapacity} positions.
     *
     * @return the request's id ({@code > 0}) for the other step calls.
     * @throws smile.llm.cache.KvCacheExhaustedException when the pool has no room now (the engine keeps the request
     *     queued and retries later).
     */
    int bind(int[] prompt, int totalCapacity);

    /** How many leading prompt tokens of a bound request are already in the KV cache (a cached prefix). */
    int prefixLen(int requestId);

    /** Prefills {@code prompt[prefixLen, length)}; the logits of the last position, {@code [1, vocab]}. */
    Tensor prefill(int requestId, int[] prompt, int prefixLen);

    /**
     * Prefills {@code prompt[from, to)}: the logits of the last position ({@code [1, vocab]}) when {@code to} is the
     * prompt's length, otherwise null. The default supports only a chunk that ends the prompt.
     */
    default Tensor prefillChunk(int requestId, int[] prompt, int from, int to) {
        if (to < prompt.length) {
            throw new UnsupportedOperationException("this executor prefills whole prompts only: override "
                    + "prefillChunk for chunked prefill");
        }
        return prefill(requestId, prompt, from);
    }

    /**
     * One decode step of several bound requests: row {@code i} feeds {@code lastTokens[i]} at position
     * {@code positions[i]} of request {@code requestIds[i]}.
     *
     * @return the next-token logits, {@code [rows, vocab]}.
     */
    Tensor decodeStep(int[] requestIds, int[] lastTokens, int[] positions);

    /** Ends a request normally: its sequence may enter the prefix cache, then its KV is released. */
    void finish(int requestId, int[] sequenceTokens);

    /** Ends a request at once (aborted or failed): its KV is released, nothing is cached. */
    void evict(int requestId);

    /** The most tokens one request may hold, prompt plus completion. */
    default int maxSeqLen() {
        return model().maxSeqLen();
    }
}
