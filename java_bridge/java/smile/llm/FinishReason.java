package smile.llm;

/** Why a generation ended, as reported in {@link ChatCompletion#reason()}. */
public enum FinishReason {
    /** The model produced an end-of-sequence or stop token (or a stop string matched). */
    stop,
    /** The output reached the requested number of new tokens, or the model's context. */
    length,
    /** The model chose to call a function (never reported by this bridge). */
    function_call,
    /** A content filter withheld output (never reported by this bridge). */
    content_filter
}
