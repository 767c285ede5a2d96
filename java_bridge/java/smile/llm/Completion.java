package smile.llm;

/**
 * The result of one generation.
 *
 * @param text the generated text (cut at a stop string).
 * @param prompt the prompt token ids.
 * @param tokens the generated token ids, without a stop token.
 * @param finishReason "stop" or "length".
 * @param logprobs the log probability of each generated token, or null when not requested.
 * @param statsJson counters and timings (cached prompt tokens, speculative rounds, ...) as a JSON object.
 */
public record Completion(String text, int[] prompt, int[] tokens, String finishReason, float[] logprobs,
                         String statsJson) {}
