package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import smile.llm.ChatCompletion;
import smile.llm.Completion;
import smile.llm.FinishReason;
import smile.llm.Message;
import smile.llm.Role;
import smile.llm.python.ChatMessage;

/**
 * Smile's value types of {@code smile.llm} as the bridge declares them: {@link Message}, {@link Role},
 * {@link FinishReason} and {@link ChatCompletion} validate and compare as Smile's do, and the bridge's
 * {@link Completion} converts to a {@code ChatCompletion}.
 */
public final class SmileRecordScenarios {
    private SmileRecordScenarios() {}

    @Scenario
    public static void messageRefusesNullsAndComparesByValue(List<String> log) {
        expect(IllegalArgumentException.class, "Message role must not be null", () -> new Message(null, "x"));
        expect(IllegalArgumentException.class, "Message content must not be null",
                () -> new Message(Role.user, null));
        expect(IllegalArgumentException.class, "Message content must not be null", () -> Message.assistant(null));
        Message m = new Message(Role.user, "hi");
        eq(Role.user, m.role(), "role()");
        eq("hi", m.content(), "content()");
        eq(m, Message.user("hi"), "equal by value");
        eq(m.hashCode(), Message.user("hi").hashCode(), "hashCode by value");
        check(!m.equals(Message.system("hi")), "another role differs");
        check(!m.equals(Message.user("ho")), "another content differs");
        check(m.toString().contains("user") && m.toString().contains("hi"), "toString: " + m);
        eq("user", m.templateRole(), "templateRole() is the Role's name");
        eq(Map.of(), m.templateFields(), "no template fields");
        log.add("ok");
    }

    @Scenario
    public static void messageFactoriesSetTheirRoles(List<String> log) {
        eq(new Message(Role.system, "s"), Message.system("s"), "system");
        eq(new Message(Role.user, "u"), Message.user("u"), "user");
        eq(new Message(Role.assistant, "a"), Message.assistant("a"), "assistant");
        eq(new ChatMessage("user", "u", Map.of("name", "ann")), Message.user("u").with("name", "ann"), "with");
        log.add("ok");
    }

    @Scenario
    public static void rolesAndFinishReasonsAreSmiles(List<String> log) {
        eq(List.of(Role.system, Role.user, Role.assistant, Role.ipython), Arrays.asList(Role.values()), "roles");
        eq(Role.ipython, Role.valueOf("ipython"), "valueOf");
        eq(List.of(FinishReason.stop, FinishReason.length, FinishReason.function_call, FinishReason.content_filter),
                Arrays.asList(FinishReason.values()), "finish reasons");
        eq("content_filter", FinishReason.content_filter.name(), "name()");
        expect(IllegalArgumentException.class, null, () -> FinishReason.valueOf("abort"));
        log.add("ok");
    }

    @Scenario
    public static void chatCompletionRefusesNullsAndComparesComponents(List<String> log) {
        int[] prompt = {1, 2, 3};
        int[] tokens = {4, 5};
        float[] lp = {-0.25f, -1.5f};
        ChatCompletion c = new ChatCompletion("m", "text", prompt, tokens, FinishReason.stop, lp);
        eq("m", c.model(), "model()");
        eq("text", c.content(), "content()");
        check(c.promptTokens() == prompt && c.completionTokens() == tokens && c.logprobs() == lp,
                "the arrays are the ones given");
        eq(FinishReason.stop, c.reason(), "reason()");
        eq(c, new ChatCompletion("m", "text", prompt, tokens, FinishReason.stop, lp), "equal components");
        eq(c.hashCode(), new ChatCompletion("m", "text", prompt, tokens, FinishReason.stop, lp).hashCode(),
                "hashCode");
        check(!c.equals(new ChatCompletion("m", "text", prompt.clone(), tokens, FinishReason.stop, lp)),
                "arrays compare by reference, as in any record");
        check(new ChatCompletion("m", "", new int[0], new int[0], FinishReason.length, null).logprobs() == null,
                "null logprobs allowed");
        expect(IllegalArgumentException.class, "model must not be null",
                () -> new ChatCompletion(null, "t", prompt, tokens, FinishReason.stop, null));
        expect(IllegalArgumentException.class, "content must not be null",
                () -> new ChatCompletion("m", null, prompt, tokens, FinishReason.stop, null));
        expect(IllegalArgumentException.class, "reason must not be null",
                () -> new ChatCompletion("m", "t", prompt, tokens, null, null));
        log.add("ok");
    }

    @Scenario
    public static void completionConvertsToChatCompletion(List<String> log) {
        int[] prompt = {7, 8};
        int[] tokens = {9};
        float[] lp = {-0.5f};
        Completion c = new Completion("x", prompt, tokens, "length", lp, "{}");
        eq(new ChatCompletion("model", "x", prompt, tokens, FinishReason.length, lp), c.toChatCompletion("model"),
                "same text, arrays and reason");
        eq(FinishReason.stop, new Completion("", prompt, new int[0], "stop", null, "{}").toChatCompletion("m")
                .reason(), "stop");
        expect(IllegalArgumentException.class, "model must not be null", () -> c.toChatCompletion(null));
        expect(IllegalArgumentException.class, "finishReason must not be null",
                () -> new Completion("x", prompt, tokens, null, null, "{}").toChatCompletion("m"));
        expect(IllegalArgumentException.class, "abort",
                () -> new Completion("x", prompt, tokens, "abort", null, "{}").toChatCompletion("m"));
        log.add("ok");
    }
}
