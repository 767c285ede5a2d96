package smile.llm.python;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import smile.llm.Message;

/**
 * A dialog turn with everything a Hugging Face chat template can read: any {@code role} string ({@code "tool"}
 * included, which Smile's {@link smile.llm.Role} lacks), a {@code content} that may be null (an assistant turn that
 * only calls tools), and the optional fields in {@code extras} ({@code "tool_calls"}, {@code "tool_call_id"},
 * {@code "name"}, {@code "reasoning_content"}, ...). Used with the list forms of
 * {@link PythonLanguageModel#encodeChat(List, boolean, Map)} and {@link PythonLanguageModel#chat(List, Map,
 * smile.llm.SamplingParams, smile.llm.GenerationListener)}, mixed freely with Smile's {@link Message}s.
 *
 * <p>The role is checked in Python when the dialog is rendered (see {@link TemplateMessage}), so a null role is
 * accepted here and refused there, naming the message.
 *
 * @param role the role string the template receives.
 * @param content the text of the turn, or null.
 * @param extras the optional fields, in insertion order (never null; unmodifiable).
 */
public record ChatMessage(String role, String content, Map<String, Object> extras) implements TemplateMessage {
    /**
     * Copies {@code extras} (null means none); {@link IllegalArgumentException} when it holds {@code "role"} or
     * {@code "content"}, which are the record's own components.
     */
    public ChatMessage {
        Map<String, Object> copy = new LinkedHashMap<>();
        if (extras != null) {
            for (Map.Entry<String, Object> e : extras.entrySet()) {
                if ("role".equals(e.getKey()) || "content".equals(e.getKey())) {
                    throw new IllegalArgumentException("extras must not hold '" + e.getKey() + "': it is a "
                            + "component of the ChatMessage itself");
                }
                copy.put(e.getKey(), e.getValue());
            }
        }
        extras = Collections.unmodifiableMap(copy);
    }

    /** A turn without optional fields. */
    public ChatMessage(String role, String content) {
        this(role, content, null);
    }

    /** Smile's {@code message} as a {@code ChatMessage} (role {@code message.role().name()}). */
    public static ChatMessage of(Message message) {
        if (message == null) throw new IllegalArgumentException("message must not be null");
        return new ChatMessage(message.role().name(), message.content());
    }

    /** A {@code "system"} turn. */
    public static ChatMessage system(String content) {
        return new ChatMessage("system", content);
    }

    /** A {@code "user"} turn. */
    public static ChatMessage user(String content) {
        return new ChatMessage("user", content);
    }

    /** An {@code "assistant"} turn. */
    public static ChatMessage assistant(String content) {
        return new ChatMessage("assistant", content);
    }

    /**
     * An {@code "assistant"} turn that calls tools: {@code toolCalls} in the OpenAI/Hugging Face form, each a map
     * such as {@code {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}}.
     */
    public static ChatMessage assistant(String content, List<Map<String, Object>> toolCalls) {
        return assistant(content).with("tool_calls", toolCalls);
    }

    /** A tool's result: Hugging Face's {@code "tool"} role. */
    public static ChatMessage tool(String content) {
        return new ChatMessage("tool", content);
    }

    /** A tool's result for the call {@code toolCallId} (the field {@code "tool_call_id"}). */
    public static ChatMessage tool(String content, String toolCallId) {
        return tool(content).with("tool_call_id", toolCallId);
    }

    /** This turn with the optional field {@code field} set to {@code value} (replacing an earlier value). */
    public ChatMessage with(String field, Object value) {
        Map<String, Object> more = new LinkedHashMap<>(extras);
        more.put(field, value);
        return new ChatMessage(role, content, more);
    }

    /** {@code role()}. */
    @Override
    public String templateRole() {
        return role;
    }

    /** {@code extras()}. */
    @Override
    public Map<String, Object> templateFields() {
        return extras;
    }
}
