package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import smile.llm.Completion;
import smile.llm.SamplingParams;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * {@link SamplingParams} from Java: every builder field (compared with Python's {@code SamplingParams} by the
 * pytest side), bad values refused by name in every call that takes them, the {@code Stream} and
 * {@code Flow.Publisher} forms, n samples and top-k logprobs. Every scenario ends with the pool audited.
 */
public final class SamplingScenarios {
    private SamplingScenarios() {}

    /** New tokens per request (set from the test's scale). */
    public static int newTokens = 8;

    static PythonLanguageModel lm() {
        return Bridge.languageModel();
    }

    static int[] prompt() {
        return lm().encode("def fib(n):\n");
    }

    /** Every field away from its default. */
    public static SamplingParams everyField() {
        Map<Integer, Double> bias = new LinkedHashMap<>();
        bias.put(5, -2.0);
        bias.put(7, 1.5);
        return SamplingParams.builder().maxNewTokens(7).temperature(0.7).topP(0.9).seed(-5L).logprobs(3)
                .stop("\n\n", "return").stopTokenIds(10, 11).speculativeTokens(2).draftSampling("sample").topK(40)
                .minP(0.05).repetitionPenalty(1.1).presencePenalty(0.5).frequencyPenalty(-0.5).logitBias(bias)
                .minNewTokens(3).n(4).promptLogprobs(2).draftTree(2, 3).build();
    }

    /** The settings of case {@code name}: one bad field each (see the pytest table). */
    public static SamplingParams bad(String name) {
        SamplingParams.Builder b = SamplingParams.builder().maxNewTokens(4);
        switch (name) {
            case "maxNewTokens": return b.maxNewTokens(-1).build();
            case "temperature": return b.temperature(Double.NaN).build();
            case "topP": return b.topP(0.0).build();
            case "topK": return b.topK(-1).build();
            case "minP": return b.minP(1.5).build();
            case "repetitionPenalty": return b.repetitionPenalty(0.0).build();
            case "presencePenalty": return b.presencePenalty(2.5).build();
            case "frequencyPenalty": return b.frequencyPenalty(-3.0).build();
            case "logitBias": return b.logitBias(Map.of(5, 200.0)).build();
            case "logitBiasVocabulary": return b.logitBias(Map.of(99_999, 1.0)).build();
            case "minNewTokens": return b.minNewTokens(-1).build();
            case "speculativeTokens": return b.speculativeTokens(-1).build();
            case "draftTree": return b.draftTree(0).build();
            case "draftTreeDepth": return b.draftTree(1, 1, 1, 1, 1, 1, 1, 1).build();
            case "draftTreeNodes": return b.draftTree(8, 8, 8, 8, 8).build();
            case "draftTreeAuto": return b.draftTree(3, 2, 2).speculativeTokensAuto().build();
            case "draftTreeDepthMismatch": return b.draftTree(3, 2, 2).speculativeTokens(2).build();
            case "draftSampling": return b.draftSampling("beam").build();
            case "stopTokenIds": return b.stopTokenIds(99_999).build();
            case "stopNull": return b.stop(java.util.Arrays.asList("x", null)).build();
            case "logprobs": return b.logprobs(21).build();
            case "promptLogprobs": return b.promptLogprobs(21).build();
            case "n": return b.n(0).build();
            case "nForOne": return b.n(2).build();
            default: throw new IllegalArgumentException(name);
        }
    }

    /** Each call that takes settings: "generate", "submit", "stream", "streamText", "chat". */
    public static void call(String how, SamplingParams params) {
        PythonLanguageModel lm = lm();
        switch (how) {
            case "generate": lm.generate(prompt(), params); return;
            case "submit": lm.submit(prompt(), params, null); return;
            case "stream": lm.stream(prompt(), params); return;
            case "streamText": lm.streamText(prompt(), params).close(); return;
            case "generateSamples": lm.generateSamples(prompt(), params); return;
            default: throw new IllegalArgumentException(how);
        }
    }

    /** {@code generate} with a recording listener (its text equal to the completion's), nothing left bound. */
    public static Completion generate(int[] prompt, SamplingParams params) {
        GenerationDrivers.Recorder r = new GenerationDrivers.Recorder();
        Completion c = lm().generate(prompt, params, r);
        eq(c.text(), r.text.toString(), "listener text equals Completion.text()");
        eq(c.tokens().length, r.generated, "generated events");
        AsyncScenarios.assertPoolClean("after generate");
        return c;
    }

    public static List<Completion> generateSamples(int[] prompt, SamplingParams params) {
        List<Completion> out = lm().generateSamples(prompt, params);
        expect(UnsupportedOperationException.class, null, () -> out.add(null));
        AsyncScenarios.assertPoolClean("after generateSamples");
        return out;
    }

    /** The text of {@code streamText}, read to its end in try-with-resources. */
    public static String streamText(int[] prompt, SamplingParams params) {
        String text;
        try (Stream<String> chunks = lm().streamText(prompt, params)) {
            text = chunks.peek(c -> check(!c.isEmpty(), "chunks are never empty")).collect(Collectors.joining());
        }
        AsyncScenarios.assertPoolClean("after a stream");
        return text;
    }

    @Scenario
    public static void builderIsAnImmutableValue(List<String> log) {
        SamplingParams p = everyField();
        eq(p, p.toBuilder().build(), "toBuilder().build() equals");
        eq(p.hashCode(), p.toBuilder().build().hashCode(), "equal hash codes");
        eq(SamplingParams.defaults(), SamplingParams.builder().build(), "defaults()");
        check(!p.equals(p.toBuilder().topK(41).build()), "a changed field differs");
        SamplingParams.Builder b = p.toBuilder();
        b.stop("other").logitBias(null);
        eq(List.of("\n\n", "return"), p.stop(), "a builder never changes a built value");
        eq(2, p.logitBias().size(), "logitBias kept");
        expect(UnsupportedOperationException.class, null, () -> p.stop().add("x"));
        expect(UnsupportedOperationException.class, null, () -> p.logitBias().put(1, 1.0));
        eq(0, (long) SamplingParams.builder().logprobs(true).build().logprobs(), "logprobs(true) is 0");
        check(SamplingParams.builder().logprobs(3).logprobs(false).build().logprobs() == null, "logprobs(false)");
        check(p.toString().contains("topK=40"), "toString names the fields: " + p);
        check(p.toString().contains("draftTree=[2, 3]"), "toString names draftTree: " + p);
        log.add(p.toString());
        draftTreeAndAutoAreValueFields(p);
    }

    static void draftTreeAndAutoAreValueFields(SamplingParams p) {
        eq(List.of(2, 3), p.draftTree(), "draftTree(2, 3)");
        expect(UnsupportedOperationException.class, null, () -> p.draftTree().add(1));
        int[] branching = {3, 2, 2};
        SamplingParams.Builder b = SamplingParams.builder().draftTree(branching);
        branching[0] = 7;
        eq(List.of(3, 2, 2), b.build().draftTree(), "the builder copies the array");
        check(b.draftTree().build().draftTree().isEmpty(), "draftTree() clears");
        check(b.draftTree((int[]) null).build().draftTree().isEmpty(), "draftTree(null) clears");
        check(SamplingParams.defaults().draftTree().isEmpty(), "no tree by default");
        check(!p.equals(p.toBuilder().draftTree(2, 2).build()), "a changed tree differs");
        eq(p, p.toBuilder().draftTree(9).draftTree(2, 3).build(), "a tree replaces the earlier one");

        SamplingParams auto = p.toBuilder().speculativeTokensAuto().build();
        check(auto.speculativeTokensAuto() && auto.speculativeTokens() == null, "speculativeTokensAuto()");
        check(!SamplingParams.defaults().speculativeTokensAuto(), "not auto by default");
        eq(auto, auto.toBuilder().build(), "toBuilder keeps auto");
        eq(auto.hashCode(), auto.toBuilder().build().hashCode(), "equal hash codes with auto");
        check(!auto.equals(p.toBuilder().speculativeTokens(null).build()), "auto differs from null");
        check(auto.toString().contains("speculativeTokensAuto=true"), "toString names auto: " + auto);
        SamplingParams three = auto.toBuilder().speculativeTokens(3).build();
        check(!three.speculativeTokensAuto() && three.speculativeTokens() == 3, "speculativeTokens(3) clears auto");
        check(!auto.toBuilder().speculativeTokens(null).build().speculativeTokensAuto(),
                "speculativeTokens(null) clears auto");
    }

    @Scenario
    public static void nullParamsAreRefused(List<String> log) {
        for (String how : List.of("generate", "submit", "stream", "streamText", "generateSamples")) {
            expect(IllegalArgumentException.class, "params must not be null", () -> call(how, null));
        }
        AsyncScenarios.assertPoolClean("after null params");
        log.add("ok");
    }

    @Scenario
    public static void oldCompletionConstructorStillCompiles(List<String> log) {
        Completion c = new Completion("t", new int[] {1}, new int[] {2}, "stop", null, "{}");
        check(c.topLogprobs() == null && c.promptLogprobs() == null, "no top-k or prompt logprobs");
        eq("t", c.text(), "text");
        log.add("ok");
    }

    @Scenario
    public static void streamClosedEarlyCancelsAndFreesPages(List<String> log) {
        SamplingParams longOne = SamplingParams.builder().maxNewTokens(200).build();
        Stream<String> chunks = lm().streamText(prompt(), longOne);
        Iterator<String> it = chunks.iterator();
        String first = it.next() + it.next();
        chunks.close();  // the request's pages are free when close returns
        AsyncScenarios.assertPoolClean("when close returns");
        CancellationException e = expect(CancellationException.class, null, () -> {
            while (it.hasNext()) it.next();  // chunks that arrived before close, then the cancellation
        });
        String text;
        try (Stream<String> three = lm().streamText(prompt(), longOne)) {
            text = three.limit(3).collect(Collectors.joining());  // a short-circuit, then close
        }
        AsyncScenarios.assertPoolClean("after try-with-resources");
        String greedy = lm().generate(prompt(), SamplingParams.builder().maxNewTokens(newTokens).build()).text();
        check(greedy.startsWith(first) || first.startsWith(greedy), "the first chunks are the greedy text's");
        check(greedy.startsWith(text) || text.startsWith(greedy), "three chunks are the greedy text's");
        log.add("cancelled with " + e.getClass().getSimpleName());
    }

    @Scenario
    public static void publisherWithParamsEqualsGenerate(List<String> log) throws Exception {
        SamplingParams params = SamplingParams.builder().maxNewTokens(newTokens).repetitionPenalty(1.3).build();
        String want = lm().generate(prompt(), params).text();
        ExecutorService requester = Executors.newSingleThreadExecutor();
        try {
            AsyncScenarios.OneByOne sub = new AsyncScenarios.OneByOne(requester, -1);
            lm().stream(prompt(), params).subscribe(sub);
            check(sub.done.await(60, TimeUnit.SECONDS), "the stream completed");
            check(sub.error == null, "stream error " + sub.error);
            eq(want, sub.text.toString(), "published text equals generate's");
        } finally {
            requester.shutdown();
        }
        CompletableFuture<Completion> f = lm().submit(prompt(), params, null);
        eq(want, f.get(60, TimeUnit.SECONDS).text(), "submit with params equals generate");
        AsyncScenarios.assertPoolClean("after the publisher");
        log.add(want.length() + " characters");
    }
}
