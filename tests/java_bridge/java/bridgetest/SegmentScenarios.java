package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.util.Arrays;
import java.util.List;
import smile.llm.Completion;
import smile.llm.SamplingParams;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;
import smile.llm.python.Segment;

/**
 * Registered segments from Java: {@code registerSegment} (text and ids), the {@code segments(...)} pieces of
 * {@link SamplingParams} (text, ids, segments), the layout at page boundaries, a segment at position 0 giving what
 * full prefill gives, {@code releaseSegment}, and bad pieces refused by name with nothing left bound. Every scenario
 * ends with the pool audited and clean.
 */
public final class SegmentScenarios {
    private SegmentScenarios() {}

    static final String DOC = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n";
    static final String QUESTION = "def sub(a, b):\n";

    static PythonLanguageModel lm() {
        return Bridge.languageModel();
    }

    static SamplingParams.Builder params() {
        return SamplingParams.builder().maxNewTokens(8);
    }

    static int[] concat(int[] a, int[] b) {
        int[] out = Arrays.copyOf(a, a.length + b.length);
        System.arraycopy(b, 0, out, a.length, b.length);
        return out;
    }

    @Scenario
    public static void registeredSegmentsAreSplicedAndReleased(List<String> log) {
        PythonLanguageModel lm = lm();
        KvCachePool pool = lm.kvCachePool();
        int pageSize = pool.pageSize();
        Segment doc = lm.registerSegment(DOC);
        eq(lm.encode(DOC), doc.tokens(), "tokens()");
        eq(65, doc.length(), "length()");
        check(doc.id() > 0, "a positive id");
        Segment ids = lm.registerSegment(lm.encode("class Stack:\n    pass\n"));
        check(ids.id() != doc.id(), "ids are never reused");
        eq(2, pool.boundRequestCount(), "each segment holds one binding");
        pool.checkInvariants();

        SamplingParams p = params().segments("# notes\n", doc, new int[] {10}, ids).build();
        eq(p, p.toBuilder().build(), "toBuilder keeps the pieces");
        eq(List.of(10), p.segments().get(2), "an int[] piece is kept as a List<Integer>");
        check(p.segments().get(1) == doc, "a segment piece is the registered object");
        check(!p.equals(params().build()), "segments are part of the value");
        check(p.toString().contains("segments=["), "toString names segments: " + p);
        Completion c = lm.generate(lm.encode(QUESTION), p);
        eq(8, c.tokens().length, "new tokens");
        check(c.statsJson().contains("\"spliced_tokens\": " + (doc.length() + ids.length())),
                "both segments spliced: " + c.statsJson());
        int[] prompt = c.prompt();
        eq(doc.tokens(), Arrays.copyOfRange(prompt, pageSize, pageSize + doc.length()),
                "the first segment sits at the first page boundary after '# notes\\n'");
        int second = (pageSize + doc.length() + 1 + pageSize - 1) / pageSize * pageSize;
        eq(ids.tokens(), Arrays.copyOfRange(prompt, second, second + ids.length()),
                "the second one at the next page boundary");

        Completion spliced = lm.generate(lm.encode(QUESTION), params().segments(doc).build());
        Completion computed = lm.generate(concat(doc.tokens(), lm.encode(QUESTION)), params().build());
        eq(computed.tokens(), spliced.tokens(), "a segment at 0 gives what full prefill gives");

        check(lm.releaseSegment(doc), "released");
        check(!lm.releaseSegment(doc), "released once");
        expect(IllegalArgumentException.class, "was released", () -> lm.generate(lm.encode(QUESTION), p));
        check(lm.releaseSegment(ids), "released");
        AsyncScenarios.assertPoolClean("after the segments' release");
        log.add("spliced=" + (doc.length() + ids.length()));
    }

    @Scenario
    public static void badSegmentsAreRefusedByName(List<String> log) {
        PythonLanguageModel lm = lm();
        int[] q = lm.encode(QUESTION);
        expect(IllegalArgumentException.class, "segment must not be null", () -> lm.registerSegment((String) null));
        expect(IllegalArgumentException.class, "empty", () -> lm.registerSegment(""));
        expect(IllegalArgumentException.class, "segment must not be null", () -> lm.releaseSegment(null));
        expect(IllegalArgumentException.class, "segments[0]", () -> lm.generate(q, params().segments(3.5).build()));
        expect(IllegalArgumentException.class, "outside the vocabulary",
                () -> lm.generate(q, params().segments(new int[] {99_999}).build()));
        Segment doc = lm.registerSegment(DOC);
        expect(IllegalArgumentException.class, "prompt_logprobs",
                () -> lm.generate(q, params().segments(doc).promptLogprobs(1).build()));
        expect(IllegalArgumentException.class, "segments",
                () -> lm.submit(q, params().segments(doc, (Object) null).build(), null));
        check(lm.releaseSegment(doc), "released");
        AsyncScenarios.assertPoolClean("after refusals");
        log.add("ok");
    }
}
