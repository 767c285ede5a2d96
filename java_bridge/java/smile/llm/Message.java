package smile.llm;

import java.util.Map;
import smile.llm.python.ChatMessage;
import smile.llm.python.TemplateMessage;

/**
 * One turn of a dialog for {@link LanguageModel#encodeChat} and {@link LanguageModel#chat}: who speaks and what they
 * say. The chat template sees it as {@code {"role": role.name(), "content": content}}.
 *
 * <p>Turns that need more than a {@link Role} and a text (Hugging Face's {@code "tool"} role, an assistant turn that
 * only calls tools, tool call ids, reasoning, ...) are {@link ChatMessage}s, which the bridge's list forms of
 * {@code encodeChat} and {@code chat} take alongside {@code Message}s ({@link #with} makes one from this turn).
 *
 * @param role who speaks (never null).
 * @param content the text of the turn (never null).
 */
public record Message(Role role, String content) implements TemplateMessage {
    /** Refuses a null {@code role} or {@code content} with {@link IllegalArgumentException}. */
    public Message {
        if (role == null) throw new IllegalArgumentException("Message role must not be null");
        if (content == null) throw new IllegalArgumentException("Message content must not be null");
    }

    /** A {@link Role#system} turn. */
    public static Message system(String content) {
        return new Message(Role.system, content);
    }

    /** A {@link Role#user} turn. */
    public static Message user(String content) {
        return new Message(Role.user, content);
    }

    /** An {@link Role#assistant} turn. */
    public static Message assistant(String content) {
        return new Message(Role.assistant, content);
    }

    /**
     * This turn as a {@link ChatMessage} (role {@code role().name()}) with the template field {@code field} set to
     * {@code value}; {@link IllegalArgumentException} for {@code "role"} or {@code "content"}.
     */
    public ChatMessage with(String field, Object value) {
        return ChatMessage.of(this).with(field, value);
    }

    /** {@code role().name()}. */
    @Override
    public String templateRole() {
        return role.name();
    }

    /** None: a {@code Message} has only its role and content. */
    @Override
    public Map<String, Object> templateFields() {
        return Map.of();
    }
}
