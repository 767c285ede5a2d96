package smile.llm;

import java.util.List;
import java.util.Map;

/**
 * The result of one generation through the bridge's own calls ({@link smile.llm.python.PythonLanguageModel}'s
 * {@code SamplingParams} forms, {@code submit}, {@code stream}, the engine): Smile's {@link ChatCompletion} plus the
 * stats and the top-k and prompt logprobs. {@link #toChatCompletion(String)} gives the {@code ChatCompletion}.
 *
 * @param text the generated text (cut at a stop string).
 * @param prompt the prompt token ids.
 * @param tokens the generated token ids, without a stop token.
 * @param finishReason "stop" or "length".
 * @param logprobs the log probability of each generated token, or null when not requested.
 * @param statsJson counters and timings (cached prompt tokens, speculative rounds, ...) as a JSON object.
 * @param topLogprobs one map per generated token, its {@code k} most likely alternatives (token id to log
 *     probability, most likely first), when {@code SamplingParams.logprobs(k)} asked for {@code k >= 1}; else null.
 * @param promptLogprobs one entry per prompt token when {@code SamplingParams.promptLogprobs(k)} was set: null for
 *     the first token (nothing precedes it), then a map holding the token's own log probability first, then its
 *     {@code k} most likely alternatives (the token appears once); else null.
 */
public record Completion(String text, int[] prompt, int[] tokens, String finishReason, float[] logprobs,
                         String statsJson, List<Map<Integer, Float>> topLogprobs,
                         List<Map<Integer, Float>> promptLogprobs) {

    /** A completion without top-k or prompt logprobs (the original six fields). */
    public Completion(String text, int[] prompt, int[] tokens, String finishReason, float[] logprobs,
                      String statsJson) {
        this(text, prompt, tokens, finishReason, logprobs, statsJson, null, null);
    }

    /**
     * Smile's {@link ChatCompletion} of this completion, attributed to {@code model}: the same text, prompt, tokens
     * and logprobs (the arrays themselves, not copies), the reason as {@link FinishReason#valueOf}
     * ({@link IllegalArgumentException} for a null {@code model} or a reason that is not one of its names).
     */
    public ChatCompletion toChatCompletion(String model) {
        if (finishReason == null) throw new IllegalArgumentException("finishReason must not be null");
        return new ChatCompletion(model, text, prompt, tokens, FinishReason.valueOf(finishReason), logprobs);
    }
}
