package smile.llm;

/**
 * Who speaks a {@link Message} of a dialog. The constants are Smile's, and their {@link #name()} is the role string
 * the model's chat template receives ({@code "system"}, {@code "user"}, {@code "assistant"}, {@code "ipython"}).
 *
 * <p>{@code ipython} is the role Llama 3 templates give to the output of code or a tool. Templates of other families
 * may not know it (Qwen's, for one, expect {@code "tool"}): for Hugging Face's {@code "tool"} role, tool calls and
 * any other template field use {@link smile.llm.python.ChatMessage} with the bridge's list forms of
 * {@code encodeChat} and {@code chat}.
 */
public enum Role {
    /** Instructions that frame the whole dialog. */
    system,
    /** The person talking to the model. */
    user,
    /** The model's own turns. */
    assistant,
    /** The output of code or a tool that the assistant ran (Llama 3's name for it). */
    ipython
}
