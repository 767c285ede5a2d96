package smile.llm;

/**
 * The outcome of {@link LanguageModel#generate} or {@link LanguageModel#chat}. As a record, two completions are equal
 * when their components are: the arrays are compared by reference, as records do.
 *
 * @param model the name of the model that produced it ({@link LanguageModel#name()}).
 * @param content the generated text.
 * @param promptTokens the token ids the model was given.
 * @param completionTokens the token ids the model generated.
 * @param reason why generation ended.
 * @param logprobs the log probability of each generated token, or null when they were not asked for.
 */
public record ChatCompletion(String model, String content, int[] promptTokens, int[] completionTokens,
                             FinishReason reason, float[] logprobs) {
    /** Refuses a null {@code model}, {@code content} or {@code reason} with {@link IllegalArgumentException}. */
    public ChatCompletion {
        if (model == null) throw new IllegalArgumentException("model must not be null");
        if (content == null) throw new IllegalArgumentException("content must not be null");
        if (reason == null) throw new IllegalArgumentException("reason must not be null");
    }
}
