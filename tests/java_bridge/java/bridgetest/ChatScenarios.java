package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import smile.llm.Completion;
import smile.llm.LanguageModel;
import smile.llm.Message;
import smile.llm.SamplingParams;
import smile.llm.python.Bridge;

/**
 * Chat from Java: {@link Message} conversations with optional fields rendered by the model's template through
 * {@code encodeChat} and answered by {@code chat}. The pytest side compares the ids and completions with Python's
 * {@code encode_chat} and {@code chat} on the same conversation ({@link #conversation()}, {@link #templateVars}).
 * The chat model is registered as "chatModel" (the default model with a chat template written by the test).
 */
public final class ChatScenarios {
    private ChatScenarios() {}

    static LanguageModel chatModel() {
        return Bridge.get("chatModel", LanguageModel.class);
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

    /** System, user, an assistant turn that reasons and calls a tool, the tool's answer, and a user turn. */
    public static List<Message> conversation() {
        Map<String, Object> call = map("type", "function", "function", map("name", "lookup", "arguments",
                arguments()));
        return List.of(
                Message.system("the radix tree remembers every prefix"),
                Message.user("the quick brown fox jumps über"),
                Message.assistant(null, List.of(call)).with("reasoning_content", "look it up first"),
                Message.tool("paged attention keeps keys", "call_1"),
                Message.user("tokens flow from the prompt into the cache"));
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
        LanguageModel lm = chatModel();
        List<Message> turn = List.of(Message.user("the lazy dog"));
        eq(lm.encodeChat(turn, true, null), lm.encodeChat(turn), "encodeChat(messages)");
        check(lm.encodeChat(turn, false, Map.of()).length < lm.encodeChat(turn).length,
                "the generation prompt adds tokens");
        SamplingParams params = SamplingParams.builder().maxNewTokens(4).build();
        int[] full = lm.chat(turn, null, params, null).tokens();
        eq(full, lm.chat(turn, params).tokens(), "chat(messages, params)");
        eq(full, lm.chat(turn, params, null).tokens(), "chat(messages, params, listener)");
        eq(full, lm.generate(lm.encodeChat(turn), params).tokens(), "chat is generate on encodeChat");
        log.add("ok");
    }

    @Scenario
    public static void messageRecordCopiesAndNamesItsFields(List<String> log) {
        Map<String, Object> extras = new LinkedHashMap<>();
        extras.put("name", "lookup");
        Message m = new Message("tool", "x", extras);
        extras.put("later", 1);
        eq(List.of("name"), new ArrayList<>(m.extras().keySet()), "extras copied at construction");
        expect(UnsupportedOperationException.class, null, () -> m.extras().put("y", 2));
        Message n = m.with("tool_call_id", "c1").with("name", "other");
        eq(Arrays.asList("name", "tool_call_id"), new ArrayList<>(n.extras().keySet()), "with keeps the order");
        eq("other", n.extras().get("name"), "with replaces a value");
        eq("lookup", m.extras().get("name"), "with leaves the original alone");
        eq(Map.of(), new Message("user", "hi").extras(), "no extras");
        eq(Map.of("tool_call_id", "c2"), Message.tool("r", "c2").extras(), "tool(content, id)");
        expect(IllegalArgumentException.class, "'role'", () -> new Message("user", "x", Map.of("role", "system")));
        expect(IllegalArgumentException.class, "'content'", () -> Message.user("x").with("content", "y"));
        log.add("ok");
    }

    @Scenario
    public static void badConversationsAreRefusedByName(List<String> log) {
        LanguageModel lm = chatModel();
        expect(IllegalArgumentException.class, "unknown role: narrator",
                () -> lm.encodeChat(List.of(new Message("narrator", "x"))));
        expect(IllegalArgumentException.class, "messages[0]['role']",
                () -> lm.encodeChat(List.of(new Message(null, "x"))));
        expect(IllegalArgumentException.class, "messages must not be null", () -> lm.encodeChat(null));
        expect(IllegalArgumentException.class, "non-empty list", () -> lm.encodeChat(List.of()));
        expect(IllegalArgumentException.class, "messages[1] must not be null",
                () -> lm.encodeChat(Arrays.asList(Message.user("a"), null)));
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
        expect(IllegalArgumentException.class, "no chat template",
                () -> Bridge.languageModel().encodeChat(List.of(Message.user("a"))));
        eq(0, lm.kvCachePool().boundRequestCount(), "nothing bound after refused chats");
        log.add("ok");
    }
}
