package smile.llm;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One turn of a conversation for {@link LanguageModel#encodeChat} and {@link LanguageModel#chat}: a {@code role}
 * ("system", "user", "assistant", "tool", or any role the model's chat template accepts), its {@code content}, and
 * the optional fields that chat templates read, in {@code extras} ({@code "tool_calls"}, {@code "tool_call_id"},
 * {@code "name"}, {@code "reasoning_content"}, ...).
 *
 * <p>The model's template sees the message as Hugging Face's message dict: {@code {"role": role, "content":
 * content, ...extras}}. Extra values may be {@code String}, {@code Number}, {@code Boolean}, {@code null},
 * {@code List} (or arrays) and {@code Map} with {@code String} keys, nested. The conversation is checked once, in
 * Python, when it is rendered: a null or empty role, or a role the template rejects, is an
 * {@link IllegalArgumentException} naming the message ({@code messages[i]['role']}) or carrying the template's
 * message; a value the template cannot read is one naming where it sits.
 *
 * @param role the speaker.
 * @param content the text of the turn (null for an assistant turn that only calls tools).
 * @param extras the optional fields, in insertion order (never null; unmodifiable).
 */
public record Message(String role, String content, Map<String, Object> extras) {
    /**
     * A message; {@code extras} is copied (null means none). {@link IllegalArgumentException} when it names
     * {@code "role"} or {@code "content"}, which are the record's own fields.
     */
    public Message {
        Map<String, Object> copy = new LinkedHashMap<>();
        if (extras != null) {
            for (Map.Entry<String, Object> e : extras.entrySet()) {
                if ("role".equals(e.getKey()) || "content".equals(e.getKey())) {
                    throw new IllegalArgumentException("extras must not hold '" + e.getKey() + "': it is a field "
                            + "of the Message itself");
                }
                copy.put(e.getKey(), e.getValue());
            }
        }
        extras = Collections.unmodifiableMap(copy);
    }

    /** A message without optional fields. */
    public Message(String role, String content) {
        this(role, content, null);
    }

    /** A system turn. */
    public static Message system(String content) {
        return new Message("system", content);
    }

    /** A user turn. */
    public static Message user(String content) {
        return new Message("user", content);
    }

    /** An assistant turn. */
    public static Message assistant(String content) {
        return new Message("assistant", content);
    }

    /**
     * An assistant turn that calls tools: {@code toolCalls} in the OpenAI/Hugging Face form, each a map such as
     * {@code {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}}.
     */
    public static Message assistant(String content, List<Map<String, Object>> toolCalls) {
        return assistant(content).with("tool_calls", toolCalls);
    }

    /** A tool's result. */
    public static Message tool(String content) {
        return new Message("tool", content);
    }

    /** A tool's result for the call {@code toolCallId} (the extra field {@code "tool_call_id"}). */
    public static Message tool(String content, String toolCallId) {
        return tool(content).with("tool_call_id", toolCallId);
    }

    /** This message with the optional field {@code field} set to {@code value} (replacing an earlier value). */
    public Message with(String field, Object value) {
        Map<String, Object> more = new LinkedHashMap<>(extras);
        more.put(field, value);
        return new Message(role, content, more);
    }
}
