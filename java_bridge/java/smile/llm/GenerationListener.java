package smile.llm;

/** Callbacks of one generation, in Smile's order: input counts once after binding, then tokens and text. */
public interface GenerationListener {
    default void onInputTokens(int n) {}
    /** Never more than the input count; 0 when prefix reuse is off or missed. */
    default void onCachedInputTokens(int n) {}
    default void onGeneratedTokens(int n) {}
    /** Reserved; never emitted. */
    default void onThinkingTokens(int n) {}
    /** Coalesced text chunks, never empty. */
    default void onText(String chunk) {}
}
