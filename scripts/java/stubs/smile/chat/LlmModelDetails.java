package smile.chat;

import smile.llm.LanguageModel;

/** Stub (out of the bridge's scope). */
public record LlmModelDetails(String family) {
    public static LlmModelDetails of(LanguageModel model, String source) { throw new UnsupportedOperationException(); }
}
