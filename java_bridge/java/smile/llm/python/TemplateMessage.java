package smile.llm.python;

import java.util.Map;

/**
 * A dialog turn as a chat template reads it: Hugging Face's message dict {@code {"role": templateRole(), "content":
 * content(), ...templateFields()}}. The bridge's list forms of {@code encodeChat} and {@code chat}
 * ({@link PythonLanguageModel}) take any implementation; the bridge has two, Smile's {@link smile.llm.Message} and
 * {@link ChatMessage}.
 *
 * <p>The turn is read once, in Python, when the dialog is rendered: a null or empty role, a role the template
 * rejects, a field named {@code "role"} or {@code "content"} or a value a template cannot read is an
 * {@link IllegalArgumentException} naming where it sits ({@code messages[2]['tool_calls'][0]}). Values may be
 * {@code String}, {@code Number}, {@code Boolean}, {@code null}, {@code List} (or arrays) and {@code Map} with
 * {@code String} keys, nested.
 */
public interface TemplateMessage {
    /** The role string the template receives ({@code "system"}, {@code "user"}, {@code "tool"}, ...). */
    String templateRole();

    /** The text of the turn (null for a turn that only carries other fields, such as tool calls). */
    String content();

    /** The template's other fields of this turn, in order ({@code "tool_calls"}, {@code "name"}, ...); never null. */
    Map<String, Object> templateFields();
}
