package smile.llm.engine;

import smile.llm.GenerationListener;
import smile.llm.Message;

/**
 * One generation job for {@link InferenceEngine#submit(GenerationRequest)}, as in Smile: either prompt token ids or
 * a chat dialog (rendered by the model's chat template when the engine receives it). When both are given the token
 * ids are used. The values are checked when the engine receives the request: a bad one is an
 * {@link IllegalArgumentException} naming it, and nothing is queued.
 *
 * @param promptTokens token ids, or null for a dialog request.
 * @param dialog the conversation so far, or null for a token request.
 * @param maxGenLen the most new tokens ({@code >= 0}).
 * @param temperature the sampling temperature; 0 is greedy.
 * @param topp the nucleus threshold, in (0, 1].
 * @param logprobs whether the completion carries each new token's log probability.
 * @param seed the random seed; 0 draws a fresh one.
 * @param listener progress callbacks, or null.
 */
public record GenerationRequest(int[] promptTokens, Message[] dialog, int maxGenLen, double temperature, double topp,
                                boolean logprobs, long seed, GenerationListener listener) {

    /** A request from already-tokenized prompt ids; {@link IllegalArgumentException} for a null prompt. */
    public static GenerationRequest ofTokens(int[] promptTokens, int maxGenLen, double temperature, double topp,
                                             boolean logprobs, long seed, GenerationListener listener) {
        if (promptTokens == null) {
            throw new IllegalArgumentException("promptTokens must not be null");
        }
        return new GenerationRequest(promptTokens, null, maxGenLen, temperature, topp, logprobs, seed, listener);
    }

    /** A request from a chat dialog; {@link IllegalArgumentException} for a null dialog. */
    public static GenerationRequest ofDialog(Message[] dialog, int maxGenLen, double temperature, double topp,
                                             boolean logprobs, long seed, GenerationListener listener) {
        if (dialog == null) {
            throw new IllegalArgumentException("dialog must not be null");
        }
        return new GenerationRequest(null, dialog, maxGenLen, temperature, topp, logprobs, seed, listener);
    }
}
