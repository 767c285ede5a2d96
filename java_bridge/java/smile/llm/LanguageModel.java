package smile.llm;

import java.util.function.BooleanSupplier;
import smile.llm.cache.KvCachePool;

/** A causal language model served from a paged KV pool with prefix reuse (and MTP speculative decoding). */
public interface LanguageModel {
    /** Token ids of {@code text}. */
    int[] encode(String text);

    /** The text of {@code tokens}. */
    String decode(int[] tokens);

    /**
     * Generates up to {@code maxGenLen} new tokens after {@code prompt}: greedy at temperature 0, nucleus sampling
     * otherwise; seed 0 is nondeterministic. Throws {@link IllegalArgumentException} for tokens outside the
     * vocabulary or bad settings.
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

    /** The model's KV pool. */
    KvCachePool kvCachePool();

    int vocabSize();

    /** The longest prompt plus completion of one request. */
    int maxSeqLen();
}
