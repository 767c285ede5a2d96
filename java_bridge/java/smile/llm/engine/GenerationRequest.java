package smile.llm.engine;

import smile.llm.GenerationListener;

/**
 * One generation job for {@link InferenceEngine#submit(GenerationRequest)}, as in Smile (prompt token ids; chat
 * dialogs and multimodal inputs are not part of this bridge). The fields are checked once, when the engine receives
 * the request, by the same validation as {@link smile.llm.LanguageModel#generate}.
 *
 * @param promptTokens token ids (required).
 * @param maxGenLen max new tokens ({@code >= 0}; a negative value is an {@link IllegalArgumentException}).
 * @param temperature sampling temperature (0: greedy).
 * @param topp nucleus top-p.
 * @param logprobs whether to return log probabilities.
 * @param seed RNG seed; {@code 0} is nondeterministic.
 * @param listener optional per-request listener (called on a delivery thread, in order).
 */
public record GenerationRequest(int[] promptTokens, int maxGenLen, double temperature, double topp, boolean logprobs,
                                long seed, GenerationListener listener) {

    /** A request from already-tokenized prompt ids; {@link IllegalArgumentException} for a null prompt. */
    public static GenerationRequest ofTokens(int[] promptTokens, int maxGenLen, double temperature, double topp,
                                             boolean logprobs, long seed, GenerationListener listener) {
        if (promptTokens == null) {
            throw new IllegalArgumentException("promptTokens must not be null");
        }
        return new GenerationRequest(promptTokens, maxGenLen, temperature, topp, logprobs, seed, listener);
    }
}
