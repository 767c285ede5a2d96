package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import smile.llm.ChatCompletion;
import smile.llm.Completion;
import smile.llm.Message;
import smile.llm.Role;
import smile.llm.SamplingParams;
import smile.llm.python.Bridge;
import smile.llm.python.ChatMessage;
import smile.llm.python.PythonLanguageModel;
import smile.llm.python.TemplateMessage;

/**
 * Chat from Java: {@link ChatMessage} conversations with optional fields (mixed with Smile's {@link Message}s)
 * rendered by the model's template through {@code encodeChat} and answered by {@code chat}, and Smile's
 * {@code Message[]} forms. The pytest side compares the ids and completions with Python's
 * {@code encode_chat} and {@code chat} on the same conversation ({@link #conversation()}, {@link #templateVars}).
 * The chat model is registered as "chatModel" (the default model with a chat template written by the test), and
 * "plainModel" is the default model without a chat template (a copy of its folder without the template files).
 */
public final class ChatScenarios {
    private ChatScenarios() {}

    static PythonLanguageModel chatModel() {
        return Bridge.get("chatModel", PythonLanguageModel.class);
    }

    static PythonLanguageModel plainModel() {
        return Bridge.get("plainModel", PythonLanguageModel.class);
    }

    /** The byte-level model's token ids of {@code text}: its UTF-8 bytes. */
    static int[] bytes(String text) {
        byte[] b = text.getBytes(java.nio.charset.StandardCharsets.UTF_8);
        int[] ids = new int[b.length];
        for (int i = 0; i < b.length; i++) ids[i] = b[i] & 0xff;
        return ids;
    }

    /** A map in the given key order (a template's {@code tojson} keeps it); values may be null. */
    static Map<String, Object> map(Object... keysAndValues) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < keysAndValues.length; i += 2) m.put((String) keysAndValues[i], keysAndValues[i + 1]);
        return m;
    }

    /** The tool call's arguments: every kind of value a template can read. */
    static Map<String, Object> arguments() {
        return map("prefix", "the fox", "limit", 3, "exact", true, "score", 2.5, "tags", List.of("a", "b"),
                "none", null, "ids", new int[] {1, 2}, "big", 1L << 40);
    }

    /**
     * System, user, an assistant turn that reasons and calls a tool, the tool's answer, and a user turn: Smile's
     * {@link Message}s where they suffice, {@link ChatMessage}s for the rest.
     */
    public static List<TemplateMessage> conversation() {
        Map<String, Object> call = map("type", "function", "function", map("name", "lookup", "arguments",
                arguments()));
        return List.of(
                Message.system("the radix tree remembers every prefix"),
                ChatMessage.user("the quick brown fox jumps über"),
                ChatMessage.assistant(null, List.of(call)).with("reasoning_content", "look it up first"),
                ChatMessage.tool("paged attention keeps keys", "call_1"),
                Message.user("tokens flow from the prompt into the cache"));
    }

    /** Smile's dialog: system, user, assistant, user (the template's roles that {@link Role} has). */
    public static Message[] dialog() {
        return new Message[] {
            Message.system("the radix tree remembers every prefix"),
            Message.user("the quick brown fox jumps über"),
            Message.assistant("paged attention keeps keys"),
            new Message(Role.user, "tokens flow from the prompt into the cache"),
        };
    }

    /** Smile's {@code encodeChat(Message...)} of {@link #dialog()}. */
    public static int[] encodeDialog() {
        Message[] d = dialog();
        int[] ids = chatModel().encodeChat(d);
        eq(ids, chatModel().encodeChat(d[0], d[1], d[2], d[3]), "varargs and array calls agree");
        eq(ids, chatModel().encodeChat(Arrays.asList(d)), "the list form agrees");
        return ids;
    }

    /** Smile's {@code chat(Message[], ...)} of {@link #dialog()}, greedy, with a recording listener. */
    public static ChatCompletion chatDialog(int maxGenLen, boolean logprobs) {
        GenerationDrivers.Recorder r = new GenerationDrivers.Recorder();
        PythonLanguageModel lm = chatModel();
        ChatCompletion c = lm.chat(dialog(), maxGenLen, 0.0, 1.0, logprobs, 0L, r);
        eq(c.content(), r.text.toString(), "listener text equals ChatCompletion.content()");
        eq(lm.encodeChat(dialog()), c.promptTokens(), "the prompt is encodeChat's");
        eq(lm.name(), c.model(), "model is name()");
        eq(c.completionTokens(), lm.generate(c.promptTokens(), maxGenLen, 0.0, 1.0, logprobs, 0L, null)
                .completionTokens(), "chat is generate on encodeChat");
        eq(0, lm.kvCachePool().boundRequestCount(), "nothing bound after chat");
        return c;
    }

    /** The template variables of case {@code name} ("none", "no_thinking", "tools_thinking"). */
    public static Map<String, Object> templateVars(String name) {
        switch (name) {
            case "none": return null;
            case "no_thinking": return map("enable_thinking", false);
            case "tools_thinking":
                return map("tools", List.of(map("type", "function", "function", map("name", "lookup",
                        "description", "finds a prefix ü", "parameters", map("type", "object", "properties",
                        map())))), "enable_thinking", true);
            default: throw new IllegalArgumentException(name);
        }
    }

    public static int[] encodeChat(boolean addGenerationPrompt, String vars) {
        return chatModel().encodeChat(conversation(), addGenerationPrompt, templateVars(vars));
    }

    /** {@code chat} with a recording listener; the listener's text equals the completion's. */
    public static Completion chat(String vars, int maxNewTokens) {
        GenerationDrivers.Recorder r = new GenerationDrivers.Recorder();
        SamplingParams params = SamplingParams.builder().maxNewTokens(maxNewTokens).build();
        Completion c = chatModel().chat(conversation(), templateVars(vars), params, r);
        eq(c.text(), r.text.toString(), "listener text equals Completion.text()");
        eq(chatModel().encodeChat(conversation(), true, templateVars(vars)), c.prompt(), "the prompt is encodeChat's");
        return c;
    }

    @Scenario
    public static void shortFormsEqualTheFullForms(List<String> log) {
        PythonLanguageModel lm = chatModel();
        List<Message> turn = List.of(Message.user("the lazy dog"));
        eq(lm.encodeChat(turn, true, null), lm.encodeChat(turn), "encodeChat(messages)");
        check(lm.encodeChat(turn, false, Map.of()).length < lm.encodeChat(turn).length,
                "the generation prompt adds tokens");
        SamplingParams params = SamplingParams.builder().maxNewTokens(4).build();
        int[] full = lm.chat(turn, null, params, null).tokens();
        eq(full, lm.chat(turn, params).tokens(), "chat(messages, params)");
        eq(full, lm.chat(turn, params, null).tokens(), "chat(messages, params, listener)");
        eq(full, lm.generate(lm.encodeChat(turn), params).tokens(), "chat is generate on encodeChat");
        eq(lm.encodeChat(turn), lm.encodeChat(Message.user("the lazy dog")), "Smile's encodeChat(Message...)");
        eq(lm.encodeChat(turn), lm.encodeChat(List.of(ChatMessage.user("the lazy dog"))), "ChatMessage.user");
        eq(lm.encodeChat(turn), lm.encodeChat(List.of(ChatMessage.of(Message.user("the lazy dog")))),
                "ChatMessage.of(Message)");
        ChatCompletion smile = lm.chat(new Message[] {Message.user("the lazy dog")}, 4, 0.0, 1.0, false, 0L, null);
        eq(full, smile.completionTokens(), "Smile's chat(Message[], ...) equals the SamplingParams form");
        log.add("ok");
    }

    @Scenario
    public static void chatMessageRecordCopiesAndNamesItsFields(List<String> log) {
        Map<String, Object> extras = new LinkedHashMap<>();
        extras.put("name", "lookup");
        ChatMessage m = new ChatMessage("tool", "x", extras);
        extras.put("later", 1);
        eq(List.of("name"), new ArrayList<>(m.extras().keySet()), "extras copied at construction");
        expect(UnsupportedOperationException.class, null, () -> m.extras().put("y", 2));
        ChatMessage n = m.with("tool_call_id", "c1").with("name", "other");
        eq(Arrays.asList("name", "tool_call_id"), new ArrayList<>(n.extras().keySet()), "with keeps the order");
        eq("other", n.extras().get("name"), "with replaces a value");
        eq("lookup", m.extras().get("name"), "with leaves the original alone");
        eq(Map.of(), new ChatMessage("user", "hi").extras(), "no extras");
        eq(Map.of("tool_call_id", "c2"), ChatMessage.tool("r", "c2").extras(), "tool(content, id)");
        eq("tool", ChatMessage.tool("r").templateRole(), "tool role");
        eq(n.extras(), n.templateFields(), "templateFields are the extras");
        expect(IllegalArgumentException.class, "'role'",
                () -> new ChatMessage("user", "x", Map.of("role", "system")));
        expect(IllegalArgumentException.class, "'content'", () -> ChatMessage.user("x").with("content", "y"));
        expect(IllegalArgumentException.class, "'content'", () -> Message.user("x").with("content", "y"));
        ChatMessage w = Message.assistant("a").with("reasoning_content", "r");
        eq(new ChatMessage("assistant", "a", Map.of("reasoning_content", "r")), w, "Message.with");
        eq(new ChatMessage("ipython", "out"), ChatMessage.of(new Message(Role.ipython, "out")), "of(ipython)");
        expect(IllegalArgumentException.class, "message must not be null", () -> ChatMessage.of(null));
        log.add("ok");
    }

    @Scenario
    public static void badConversationsAreRefusedByName(List<String> log) {
        PythonLanguageModel lm = chatModel();
        expect(IllegalArgumentException.class, "unknown role: narrator",
                () -> lm.encodeChat(List.of(new ChatMessage("narrator", "x"))));
        expect(IllegalArgumentException.class, "unknown role: ipython",
                () -> lm.encodeChat(new Message(Role.ipython, "x")));
        expect(IllegalArgumentException.class, "messages[0]['role']",
                () -> lm.encodeChat(List.of(new ChatMessage(null, "x"))));
        expect(IllegalArgumentException.class, "messages must not be null",
                () -> lm.encodeChat((List<Message>) null, true, null));
        expect(IllegalArgumentException.class, "dialog (messages) must not be null",
                () -> lm.encodeChat((List<Message>) null));
        expect(IllegalArgumentException.class, "dialog (messages) must not be null",
                () -> lm.encodeChat((Message[]) null));
        expect(IllegalArgumentException.class, "non-empty list", () -> lm.encodeChat(List.of()));
        expect(IllegalArgumentException.class, "dialog must hold at least one Message", () -> lm.encodeChat());
        expect(IllegalArgumentException.class, "messages[1] must not be null",
                () -> lm.encodeChat(Arrays.asList(Message.user("a"), null)));
        expect(IllegalArgumentException.class, "dialog[1] must not be null",
                () -> lm.encodeChat(Message.user("a"), null));
        expect(IllegalArgumentException.class, "dialog must not be null",
                () -> lm.chat((Message[]) null, 4, 0.0, 1.0, false, 0L, null));
        expect(IllegalArgumentException.class, "dialog[0] must not be null",
                () -> lm.chat(new Message[] {null}, 4, 0.0, 1.0, false, 0L, null, null));
        expect(IllegalArgumentException.class, "maxGenLen (max_new_tokens)",
                () -> lm.chat(dialog(), -1, 0.0, 1.0, false, 0L, null));
        expect(IllegalArgumentException.class, "template field named 'role'",
                () -> lm.encodeChat(List.of(new RogueTurn())));
        expect(IllegalArgumentException.class, "messages[0]['meta'] is a java.lang.Thread",
                () -> lm.encodeChat(List.of(Message.user("a").with("meta", Thread.currentThread()))));
        expect(IllegalArgumentException.class, "templateVars['tools'][0]",
                () -> lm.encodeChat(List.of(Message.user("a")), true, map("tools", List.of(new Object()))));
        expect(IllegalArgumentException.class, "must not set 'add_generation_prompt'",
                () -> lm.encodeChat(List.of(Message.user("a")), true, map("add_generation_prompt", false)));
        SamplingParams bad = SamplingParams.builder().topK(-1).build();
        expect(IllegalArgumentException.class, "topK (top_k)", () -> lm.chat(List.of(Message.user("a")), bad));
        expect(IllegalArgumentException.class, "generateSamples",
                () -> lm.chat(List.of(Message.user("a")), SamplingParams.builder().n(2).build()));
        String looked = "no chat template: looked for chat_template.jinja and 'chat_template' in tokenizer_config.json";
        expect(IllegalArgumentException.class, looked,
                () -> plainModel().encodeChat(List.of(Message.user("a"))));
        expect(IllegalArgumentException.class, looked, () -> plainModel().encodeChat(Message.user("a")));
        expect(IllegalArgumentException.class, looked,
                () -> plainModel().chat(new Message[] {Message.user("a")}, 4, 0.0, 1.0, false, 0, null));
        eq(0, lm.kvCachePool().boundRequestCount(), "nothing bound after refused chats");
        eq(0, plainModel().kvCachePool().boundRequestCount(), "nothing bound after chats without a template");
        log.add("ok");
    }

    /** A {@link TemplateMessage} of its own whose fields repeat the role. */
    static final class RogueTurn implements TemplateMessage {
        @Override public String templateRole() { return "user"; }
        @Override public String content() { return "x"; }
        @Override public Map<String, Object> templateFields() { return Map.of("role", "system"); }
    }

    /** The shipped default model carries a ChatML template: Smile's chat works on it out of the box. */
    @Scenario
    public static void theDefaultModelChatsInChatML(List<String> log) {
        PythonLanguageModel lm = Bridge.languageModel();
        Message[] d = {Message.system("be brief"), Message.user("über")};
        int[] prompt = lm.encodeChat(d);
        eq(bytes("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nüber<|im_end|>\n"
                + "<|im_start|>assistant\n"), prompt, "the ChatML prompt, byte for byte");
        eq(prompt, lm.encodeChat(Arrays.asList(d)), "the list form agrees");
        ChatCompletion c = lm.chat(d, 6, 0.0, 1.0, false, 0L, null);
        eq(prompt, c.promptTokens(), "the prompt is encodeChat's");
        eq(lm.generate(prompt, 6, 0.0, 1.0, false, 0L, null).completionTokens(), c.completionTokens(),
                "chat is generate on encodeChat");
        eq(0, lm.kvCachePool().boundRequestCount(), "nothing bound after chat");
        log.add("ok");
    }

    @Scenario
    public static void smileChatIsCancelledBetweenSteps(List<String> log) {
        PythonLanguageModel lm = chatModel();
        int[] polls = {0};
        expect(java.util.concurrent.CancellationException.class, null,
                () -> lm.chat(dialog(), 16, 0.0, 1.0, false, 0L, null, () -> polls[0]++ >= 2));
        eq(3, polls[0], "cancel polls");
        eq(0, lm.kvCachePool().boundRequestCount(), "the request's KV was released");
        lm.kvCachePool().checkInvariants();
        log.add("ok");
    }
}
