package bridgetest;

import static bridgetest.Check.check;
import static bridgetest.Check.eq;
import static bridgetest.Check.expect;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.MalformedInputException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.function.BiFunction;
import smile.deep.tensor.ScalarType;
import smile.deep.tensor.Tensor;
import smile.llm.GenerationListener;
import smile.llm.engine.Sampling;
import smile.llm.engine.TextStreamer;

/**
 * The engine's pure-Java helpers, with exact values: {@link TextStreamer} (chunking, forced flush, a multi-byte
 * UTF-8 character held back until complete, the null listener, the {@code maxTokens} cap, refused arguments) and
 * {@link Sampling} (argmax rows at temperature 0, a top-p so small it is greedy, draws only from the nucleus,
 * {@code mergeWithPromptMask}, refused shapes and dtypes). No pool is made.
 *
 * <p>The draws at {@code temperature > 0} are random ({@code ThreadLocalRandom}); every assertion on them is a
 * property that holds for every draw (the token is in the nucleus), except the one noted in
 * {@link #samplingWhenNucleusOfTwoThenNeverAThird}, whose failure probability is below 1e-800.
 */
public final class EngineHelperScenarios {
    private EngineHelperScenarios() {}

    // ---------------------------------------------------------------------------------------------------------
    // TextStreamer

    /**
     * A byte-level decoder: token ids 0..255 are UTF-8 bytes; ids from 256 up are special tokens, dropped when
     * {@code skipSpecial} is set (else written {@code <id>}). A malformed or incomplete byte sequence throws an
     * {@link UncheckedIOException} whose cause is the decoder's {@link CharacterCodingException}, the form
     * {@link TextStreamer} waits on. Every call is recorded.
     */
    static final class ByteDecoder implements BiFunction<int[], Boolean, String> {
        final List<String> calls = new ArrayList<>();
        /** Thrown (once) by the next call instead of decoding, when set. */
        RuntimeException failNext;

        @Override
        public String apply(int[] tokens, Boolean skipSpecial) {
            calls.add(Arrays.toString(tokens) + (skipSpecial ? "" : " keep special"));
            if (failNext != null) {
                RuntimeException e = failNext;
                failNext = null;
                throw e;
            }
            StringBuilder text = new StringBuilder();
            ByteBuffer bytes = ByteBuffer.allocate(tokens.length);
            for (int t : tokens) {
                if (t < 256) {
                    bytes.put((byte) t);
                } else {
                    flush(bytes, text);
                    if (!skipSpecial) text.append('<').append(t).append('>');
                }
            }
            flush(bytes, text);
            return text.toString();
        }

        private static void flush(ByteBuffer bytes, StringBuilder text) {
            bytes.flip();
            try {
                text.append(StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT).decode(bytes));
            } catch (CharacterCodingException e) {
                throw new UncheckedIOException(e);
            }
            bytes.clear();
        }
    }

    /** Records every {@code onText} chunk. */
    static final class Chunks implements GenerationListener {
        final List<String> chunks = new ArrayList<>();

        @Override
        public void onText(String chunk) {
            chunks.add(chunk);
        }
    }

    /** The byte tokens of {@code s} in UTF-8. */
    static int[] bytes(String s) {
        byte[] b = s.getBytes(StandardCharsets.UTF_8);
        int[] out = new int[b.length];
        for (int i = 0; i < b.length; i++) out[i] = b[i] & 0xff;
        return out;
    }

    static String slice(String s, int from, int to) {
        return Arrays.toString(Arrays.copyOfRange(bytes(s), from, to));
    }

    @Scenario
    public static void textStreamerWhenBelowChunkThenNothingUntilChunk(List<String> log) {
        ByteDecoder decoder = new ByteDecoder();
        Chunks out = new Chunks();
        TextStreamer s = new TextStreamer(16, 4, decoder);
        int[] tokens = bytes("abcdefg");
        for (int i = 0; i < 3; i++) {
            s.accept(tokens[i]);
            s.maybeEmit(out, false);
        }
        eq(List.of(), out.chunks, "3 of 4 tokens: no chunk");
        eq(List.of(), decoder.calls, "3 of 4 tokens: not even decoded");
        s.accept(tokens[3]);
        s.maybeEmit(out, false);
        eq(List.of("abcd"), out.chunks, "the 4th token emits the chunk");
        eq(List.of(slice("abcd", 0, 4)), decoder.calls, "decoded once, skipSpecial set");
        s.maybeEmit(out, false);
        eq(List.of("abcd"), out.chunks, "nothing pending: no second emit");
        for (int i = 4; i < 7; i++) {
            s.accept(tokens[i]);
            s.maybeEmit(out, false);
        }
        eq(List.of("abcd"), out.chunks, "3 new tokens: no chunk");
        eq(1, decoder.calls.size(), "decode calls");
        log.add("chunks " + out.chunks);
    }

    @Scenario
    public static void textStreamerWhenChunksAndForceThenEveryTokenOnce(List<String> log) {
        ByteDecoder decoder = new ByteDecoder();
        Chunks out = new Chunks();
        TextStreamer s = new TextStreamer(64, 4, decoder);
        String text = "hello, world";  // 12 tokens
        int[] tokens = bytes(text);
        for (int i = 0; i < 10; i++) {
            s.accept(tokens[i]);
            s.maybeEmit(out, false);
        }
        eq(List.of("hell", "o, w"), out.chunks, "two chunks of 4");
        s.maybeEmit(out, true);
        eq(List.of("hell", "o, w", "or"), out.chunks, "force emits the 2 pending tokens");
        s.maybeEmit(out, true);
        s.maybeEmit(out, false);
        eq(3, out.chunks.size(), "nothing pending: force emits nothing");
        eq(List.of(slice(text, 0, 4), slice(text, 4, 8), slice(text, 8, 10)), decoder.calls,
                "each token decoded in exactly one call, none after the forced emit");

        // several chunks' worth pending at the first maybeEmit: one chunk of all of them ("at least" chunkTokens)
        s.accept(tokens[10]);
        s.accept(tokens[11]);
        for (int t : bytes("!!!!!")) s.accept(t);
        s.maybeEmit(out, false);
        eq(List.of("hell", "o, w", "or", "ld!!!!!"), out.chunks, "7 pending tokens: one chunk");
        eq(text + "!!!!!", String.join("", out.chunks), "the chunks concatenate to the text, nothing twice");

        // force with 1 pending token of a chunk of 4
        s.accept('?');
        s.maybeEmit(out, true);
        eq("?", out.chunks.get(out.chunks.size() - 1), "force below chunkTokens");
        eq(5, out.chunks.size(), "chunks");
        log.add("chunks " + out.chunks);
    }

    @Scenario
    public static void textStreamerWhenDefaultChunkThenTwentyTokens(List<String> log) {
        eq(20, TextStreamer.DEFAULT_CHUNK_TOKENS, "Smile's default");
        ByteDecoder decoder = new ByteDecoder();
        Chunks out = new Chunks();
        TextStreamer s = new TextStreamer(100, decoder);
        String text = "abcdefghijklmnopqrstuvwxyz";
        int[] tokens = bytes(text);
        for (int i = 0; i < 19; i++) {
            s.accept(tokens[i]);
            s.maybeEmit(out, false);
        }
        eq(List.of(), out.chunks, "19 tokens: nothing");
        s.accept(tokens[19]);
        s.maybeEmit(out, false);
        eq(List.of(text.substring(0, 20)), out.chunks, "the 20th token emits");
        for (int i = 20; i < tokens.length; i++) s.accept(tokens[i]);
        s.maybeEmit(out, false);
        eq(1, out.chunks.size(), "6 more: nothing");
        s.maybeEmit(out, true);
        eq(List.of(text.substring(0, 20), text.substring(20)), out.chunks, "forced rest");
        log.add("chunks " + out.chunks);
    }

    @Scenario
    public static void textStreamerWhenCharacterSplitThenHeldUntilComplete(List<String> log) {
        // chunk of 1: every token is a chunk, but no chunk ends inside a character
        ByteDecoder decoder = new ByteDecoder();
        Chunks out = new Chunks();
        TextStreamer s = new TextStreamer(64, 1, decoder);
        String text = "a€b😀";  // 1 + 3 + 1 + 4 bytes
        int[] tokens = bytes(text);
        eq(9, tokens.length, "UTF-8 bytes");
        List<List<String>> after = new ArrayList<>();
        for (int t : tokens) {
            s.accept(t);
            s.maybeEmit(out, false);
            after.add(List.copyOf(out.chunks));
        }
        eq(List.of("a"), after.get(0), "ASCII at once");
        eq(List.of("a"), after.get(1), "1 byte of 3 of '€': held");
        eq(List.of("a"), after.get(2), "2 bytes of 3 of '€': held");
        eq(List.of("a", "€"), after.get(3), "'€' complete");
        eq(List.of("a", "€", "b"), after.get(4), "b");
        eq(List.of("a", "€", "b"), after.get(7), "3 bytes of 4 of the emoji: held");
        eq(List.of("a", "€", "b", "😀"), after.get(8), "emoji complete");
        eq(List.of(slice(text, 0, 1), slice(text, 1, 2), slice(text, 1, 3), slice(text, 1, 4),
                slice(text, 4, 5), slice(text, 5, 6), slice(text, 5, 7), slice(text, 5, 8), slice(text, 5, 9)),
                decoder.calls, "a held chunk is retried from its first byte with the new tokens");
        eq(text, String.join("", out.chunks), "all text, once");

        // a force does not emit an incomplete character either; the tokens stay pending
        for (int t : bytes("x")) s.accept(t);
        s.accept(0xC3);  // first byte of 'é'
        s.maybeEmit(out, true);
        eq(4, out.chunks.size(), "forced 'x' + half an 'é': held as one chunk");
        s.accept(0xA9);
        s.maybeEmit(out, false);
        eq("xé", out.chunks.get(4), "completed: the held 'x' comes with the 'é'");
        eq(text + "xé", String.join("", out.chunks), "all text, once");

        // chunk of 2 whose boundary falls inside a character
        ByteDecoder d2 = new ByteDecoder();
        Chunks out2 = new Chunks();
        TextStreamer s2 = new TextStreamer(64, 2, d2);
        for (int t : bytes("zé")) {  // 'z', 0xC3 | 0xA9
            s2.accept(t);
            s2.maybeEmit(out2, false);
        }
        eq(List.of("zé"), out2.chunks, "chunk [z, C3] held, emitted with A9");
        eq(List.of(slice("zé", 0, 2), slice("zé", 0, 3)), d2.calls, "decode calls");
        log.add("chunks " + out.chunks + " " + out2.chunks);
    }

    @Scenario
    public static void textStreamerWhenDecoderFailsOtherwiseThenRethrownAndPending(List<String> log) {
        ByteDecoder decoder = new ByteDecoder();
        Chunks out = new Chunks();
        TextStreamer s = new TextStreamer(16, 2, decoder);
        for (int t : bytes("ab")) s.accept(t);
        // a CharacterCodingException subclass as the cause: held, as an incomplete character
        decoder.failNext = new UncheckedIOException(new MalformedInputException(1));
        s.maybeEmit(out, false);
        eq(List.of(), out.chunks, "MalformedInputException cause: held");
        // any other failure propagates unchanged, and the tokens stay pending
        IllegalStateException boom = new IllegalStateException("boom");
        decoder.failNext = boom;
        check(expect(IllegalStateException.class, "boom", () -> s.maybeEmit(out, false)) == boom, "same one");
        decoder.failNext = new UncheckedIOException(new IOException("disk"));
        expect(UncheckedIOException.class, "disk", () -> s.maybeEmit(out, true));
        // a CharacterCodingException deeper than the direct cause is not recognised (Smile checks getCause())
        decoder.failNext = new RuntimeException(new RuntimeException(new MalformedInputException(1)));
        expect(RuntimeException.class, null, () -> s.maybeEmit(out, true));
        eq(List.of(), out.chunks, "nothing emitted by a failed decode");
        s.maybeEmit(out, true);
        eq(List.of("ab"), out.chunks, "the pending tokens, once the decoder works");
        eq(5, decoder.calls.size(), "decode calls");
        check(decoder.calls.stream().allMatch(c -> c.equals(slice("ab", 0, 2))), "same slice each time");
        log.add("chunks " + out.chunks);
    }

    @Scenario
    public static void textStreamerWhenEmptyTextThenConsumedNotEmitted(List<String> log) {
        ByteDecoder decoder = new ByteDecoder();
        Chunks out = new Chunks();
        TextStreamer s = new TextStreamer(16, 2, decoder);
        s.accept(300);
        s.accept(301);  // two special tokens: "" with skipSpecial
        s.maybeEmit(out, false);
        eq(List.of(), out.chunks, "an empty text is not emitted");
        s.maybeEmit(out, true);
        eq(List.of("[300, 301]"), decoder.calls, "decoded once: consumed");
        s.accept('o');
        s.accept(302);
        s.accept('k');
        s.maybeEmit(out, false);
        eq(List.of("ok"), out.chunks, "special tokens skipped inside a chunk");
        eq("[111, 302, 107]", decoder.calls.get(1), "the chunk's slice");

        // a decoder returning null: consumed, nothing emitted
        Chunks nulls = new Chunks();
        List<String> seen = new ArrayList<>();
        TextStreamer n = new TextStreamer(4, 1, (tokens, skip) -> {
            seen.add(Arrays.toString(tokens));
            return null;
        });
        n.accept(1);
        n.maybeEmit(nulls, false);
        n.maybeEmit(nulls, true);
        eq(List.of(), nulls.chunks, "null text");
        eq(List.of("[1]"), seen, "decoded once");
        log.add("chunks " + out.chunks);
    }

    @Scenario
    public static void textStreamerWhenNullListenerThenIgnored(List<String> log) {
        ByteDecoder decoder = new ByteDecoder();
        TextStreamer s = new TextStreamer(16, 1, decoder);
        for (int t : bytes("abc")) {
            s.accept(t);
            s.maybeEmit(null, false);
        }
        s.maybeEmit(null, true);
        eq(List.of(), decoder.calls, "no listener: nothing decoded");
        Chunks out = new Chunks();
        s.maybeEmit(out, false);
        eq(List.of("abc"), out.chunks, "the tokens stayed pending for the next listener");
        s.accept('d');
        s.maybeEmit(null, true);
        s.maybeEmit(out, true);
        eq(List.of("abc", "d"), out.chunks, "chunks");
        log.add("chunks " + out.chunks);
    }

    @Scenario
    public static void textStreamerWhenOverMaxTokensThenIgnored(List<String> log) {
        ByteDecoder decoder = new ByteDecoder();
        Chunks out = new Chunks();
        TextStreamer s = new TextStreamer(3, 2, decoder);
        for (int t : bytes("abcde")) {
            s.accept(t);
            s.maybeEmit(out, false);
        }
        eq(List.of("ab"), out.chunks, "'c' pending (1 of 2), 'd' and 'e' past maxTokens");
        s.maybeEmit(out, true);
        eq(List.of("ab", "c"), out.chunks, "force: only 'c'");
        s.accept('f');
        s.accept('g');
        s.maybeEmit(out, true);
        eq(List.of("ab", "c"), out.chunks, "full: later tokens ignored, nothing more emitted");
        eq(List.of(slice("ab", 0, 2), slice("c", 0, 1)), decoder.calls, "decode calls");

        TextStreamer one = new TextStreamer(1, 5, decoder);
        one.accept('x');
        one.accept('y');
        one.maybeEmit(out, true);
        eq("x", out.chunks.get(2), "maxTokens 1");

        // the cap cuts a character: its bytes stay pending, never emitted
        Chunks cut = new Chunks();
        TextStreamer c = new TextStreamer(2, 1, decoder);
        for (int t : bytes("€")) c.accept(t);
        c.maybeEmit(cut, true);
        c.maybeEmit(cut, true);
        eq(List.of(), cut.chunks, "2 of 3 bytes kept: incomplete, never emitted");
        log.add("chunks " + out.chunks);
    }

    @Scenario
    public static void textStreamerWhenBadArgumentsThenRefusedOrClamped(List<String> log) {
        ByteDecoder decoder = new ByteDecoder();
        for (int max : new int[] {0, -1, Integer.MIN_VALUE}) {
            expect(IllegalArgumentException.class, "maxTokens must be >= 1", () -> new TextStreamer(max, decoder));
            expect(IllegalArgumentException.class, "maxTokens must be >= 1",
                    () -> new TextStreamer(max, 4, decoder));
        }
        // chunkTokens below 1 is used as 1 (Smile's Math.max(1, chunkTokens)), not refused
        for (int chunk : new int[] {0, -3, Integer.MIN_VALUE}) {
            Chunks out = new Chunks();
            TextStreamer s = new TextStreamer(8, chunk, decoder);
            for (int t : bytes("pq")) {
                s.accept(t);
                s.maybeEmit(out, false);
            }
            eq(List.of("p", "q"), out.chunks, "chunkTokens " + chunk + " emits every token");
        }
        log.add("maxTokens < 1 refused; chunkTokens < 1 used as 1");
    }

    // ---------------------------------------------------------------------------------------------------------
    // Sampling

    static long[] draw(Tensor logits, double temperature, double topp) {
        Tensor next = Sampling.sampleNext(logits, temperature, topp);
        eq(ScalarType.Int64, next.dtype(), "sampleNext dtype");
        eq(new long[] {logits.length() / logits.size(-1)}, next.shape(), "sampleNext shape: [rows]");
        return next.longArray();
    }

    /** {@code rows} copies of {@code row}. */
    static float[] repeat(float[] row, int rows) {
        float[] out = new float[row.length * rows];
        for (int r = 0; r < rows; r++) System.arraycopy(row, 0, out, r * row.length, row.length);
        return out;
    }

    /** Natural logs of {@code p}: softmax of the result is {@code p} (normalised). */
    static float[] logs(double... p) {
        float[] out = new float[p.length];
        for (int i = 0; i < p.length; i++) out[i] = (float) Math.log(p[i]);
        return out;
    }

    @Scenario
    public static void samplingWhenTemperatureZeroThenArgmaxRows(List<String> log) {
        float[] data = {
            0.1f, 0.9f, 0.3f, -1f,
            5f, 5f, 1f, 0f,  // a tie: the first maximum, as torch's argmax
            -3f, -2f, -1f, -4f,
            Float.NEGATIVE_INFINITY, -1e30f, Float.NEGATIVE_INFINITY, -1e31f};
        Tensor logits = Tensor.of(data, 4, 4);
        for (double temperature : new double[] {0.0, -0.0, -1.0, Double.NEGATIVE_INFINITY}) {
            for (double topp : new double[] {0.0, 0.5, 1.0, 7.0}) {
                eq(new long[] {1, 0, 2, 1}, draw(logits, temperature, topp), "argmax at T=" + temperature);
            }
        }
        check(Arrays.equals(data, logits.floatArray()), "logits unchanged");

        double[] d = {2.0, -1.0, 2.5, /* row 2 */ 7.0, 7.5, 7.25};
        eq(new long[] {2, 1}, draw(Tensor.of(d, 2, 1, 3), 0.0, 0.9), "Double [2, 1, 3]: flattened to [2]");
        eq(new long[] {3}, draw(Tensor.of(new float[] {0f, 1f, 2f, 3f}), 0.0, 0.9), "a vector: one row");
        eq(new long[] {0, 0, 0}, draw(Tensor.of(new float[3], 3, 1), 0.0, 0.9), "vocabulary of 1");
        eq(new long[] {1, 0, 0, 0, 0, 1}, draw(Tensor.of(new float[] {0, 1, 1, 0, 0, 0, 1, 0, 2, 1, -1, 0},
                2, 3, 2), 0.0, 0.9), "[2, 3, 2]: six rows");
        eq(new long[0], draw(Tensor.of(new float[0], 0, 5), 0.0, 0.9), "no rows");
        log.add("argmax rows");
    }

    @Scenario
    public static void samplingWhenToppTinyThenGreedy(List<String> log) {
        // the nucleus is the one most likely token whatever the temperature, so every draw is the argmax
        float[] row = {1.0f, 1.001f, 0.5f, -2f, 1.0005f};
        int rows = 500;
        Tensor logits = Tensor.of(repeat(row, rows), rows, row.length);
        long[] greedy = new long[rows];
        Arrays.fill(greedy, 1);
        for (double temperature : new double[] {1e-3, 0.7, 1.0, 2.0, 100.0}) {
            for (double topp : new double[] {1e-9, 0.0}) {
                eq(greedy, draw(logits, temperature, topp), "T=" + temperature + " topp=" + topp);
            }
        }
        // topp below the top token's probability (0.5): only that token
        Tensor p = Tensor.of(repeat(logs(0.3, 0.5, 0.15, 0.05), rows), rows, 4);
        eq(greedy, draw(p, 1.0, 0.45), "topp 0.45 < p(top) 0.5");
        Tensor dbl = Tensor.of(new double[] {0, 0, 0, 10, /* row 2 */ 12, 0, 0, 0}, 2, 4);
        for (int i = 0; i < 200; i++) {
            eq(new long[] {3, 0}, draw(dbl, 1.0, 0.99), "a token of probability > 0.99 is the whole nucleus");
        }
        log.add("greedy draws");
    }

    /**
     * A row whose nucleus is two tokens never yields a third: asserted for every one of 4000 draws. That both
     * tokens of the nucleus occur is asserted too: it fails only if 4000 independent draws all pick the same
     * one, probability 0.625^4000 + 0.375^4000 (below 1e-800).
     */
    @Scenario
    public static void samplingWhenNucleusOfTwoThenNeverAThird(List<String> log) {
        int rows = 4000;
        // p = 0.3, 0.05, 0.5, 0.15: at topp 0.7 the nucleus is {2 (0.5), 0 (0.3)} (0.8 >= 0.7 with a margin)
        Tensor logits = Tensor.of(repeat(logs(0.3, 0.05, 0.5, 0.15), rows), rows, 4);
        long[] next = draw(logits, 1.0, 0.7);
        long[] count = new long[4];
        for (long t : next) count[(int) t]++;
        eq(0, count[1] + count[3], "tokens outside the nucleus {2, 0} " + Arrays.toString(count));
        check(count[0] > 0 && count[2] > 0, "both nucleus tokens drawn: " + Arrays.toString(count));

        // the nucleus is taken on softmax(logits / T): at T=1 and topp 0.9 it is {0, 1, 2} of (.5, .3, .15, .05);
        // at T=0.5 the probabilities are (.6925, .2493, .0623, .0069), whose 0.9 nucleus is {0, 1} (.9418)
        double[] row = {Math.log(0.5), Math.log(0.3), Math.log(0.15), Math.log(0.05)};
        double[] data = new double[row.length * rows];
        for (int r = 0; r < rows; r++) System.arraycopy(row, 0, data, r * row.length, row.length);
        Tensor dbl = Tensor.of(data, rows, 4);
        long[] sharp = draw(dbl, 0.5, 0.9);
        check(Arrays.stream(sharp).allMatch(t -> t == 0 || t == 1), "T=0.5 draws outside {0, 1}");
        long[] flat = draw(dbl, 1.0, 0.9);
        check(Arrays.stream(flat).allMatch(t -> t >= 0 && t <= 2), "T=1 draws outside {0, 1, 2}");

        // rows are independent: row 0's nucleus is {0, 1}, row 1's is {3}, row 2's {1, 2}
        float[] mixed = new float[3 * 4 * 1000];
        float[][] kinds = {logs(0.5, 0.3, 0.15, 0.05), {0f, 0f, 0f, 10f}, logs(0.05, 0.45, 0.4, 0.1)};
        for (int r = 0; r < 3000; r++) System.arraycopy(kinds[r % 3], 0, mixed, r * 4, 4);
        long[] m = draw(Tensor.of(mixed, 3000, 4), 1.0, 0.7);
        for (int r = 0; r < m.length; r++) {
            long t = m[r];
            boolean ok = switch (r % 3) {
                case 0 -> t == 0 || t == 1;
                case 1 -> t == 3;
                default -> t == 1 || t == 2;
            };
            check(ok, "row " + r + " drew " + t);
        }
        log.add("nucleus counts " + Arrays.toString(count));
    }

    @Scenario
    public static void mergeWithPromptMaskWhenMaskThenExactTokens(List<String> log) {
        Tensor mask = Tensor.of(new boolean[] {true, false, true, false});
        Tensor current = Tensor.of(new long[] {10, 0, 12, 0});
        Tensor next = Tensor.of(new long[] {7, 8, 9, 6});
        Tensor merged = Sampling.mergeWithPromptMask(mask, current, next);
        eq(ScalarType.Int64, merged.dtype(), "Int64 in, Int64 out");
        eq(new long[] {4}, merged.shape(), "shape");
        eq(new long[] {10, 8, 12, 6}, merged.longArray(), "prompt positions keep their token");
        eq(new long[] {10, 0, 12, 0}, current.longArray(), "currentTokens unchanged");
        eq(new long[] {7, 8, 9, 6}, next.longArray(), "nextToken unchanged");

        Tensor mask2 = Tensor.of(new boolean[] {false, true, true, false, false, true}, 2, 3);
        Tensor cur2 = Tensor.of(new int[] {1, 2, 3, 4, 5, 6}, 2, 3);
        Tensor next2 = Tensor.of(new int[] {-1, -2, -3, -4, -5, -6}, 2, 3);
        Tensor m2 = Sampling.mergeWithPromptMask(mask2, cur2, next2);
        eq(ScalarType.Int32, m2.dtype(), "Int32 in, Int32 out");
        eq(new long[] {2, 3}, m2.shape(), "shape [2, 3]");
        eq(new int[] {-1, 2, 3, -4, -5, 6}, m2.intArray(), "Int32 merge");

        Tensor all = Tensor.of(new boolean[] {true, true, true});
        Tensor none = Tensor.of(new boolean[] {false, false, false});
        Tensor c3 = Tensor.of(new long[] {1, 2, 3});
        Tensor n3 = Tensor.of(new long[] {Long.MAX_VALUE, -1, Long.MIN_VALUE});
        eq(new long[] {1, 2, 3}, Sampling.mergeWithPromptMask(all, c3, n3).longArray(), "all prompt");
        eq(new long[] {Long.MAX_VALUE, -1, Long.MIN_VALUE}, Sampling.mergeWithPromptMask(none, c3, n3).longArray(),
                "no prompt");
        Tensor empty = Sampling.mergeWithPromptMask(Tensor.of(new boolean[0]), Tensor.of(new long[0]),
                Tensor.of(new long[0]));
        eq(new long[] {0}, empty.shape(), "empty");

        // the engine's use: sampled tokens through the mask
        Tensor sampled = Sampling.sampleNext(Tensor.of(new float[] {0, 9, 0, /* */ 0, 0, 9, /* */ 9, 0, 0}, 3, 3),
                0.0, 1.0);
        eq(new long[] {5, 2, 0}, Sampling.mergeWithPromptMask(Tensor.of(new boolean[] {true, false, false}),
                Tensor.of(new long[] {5, 0, 0}), sampled).longArray(), "prompt token 5, then argmax 2 and 0");
        log.add("merged " + Arrays.toString(merged.longArray()) + " " + Arrays.toString(m2.intArray()));
    }

    @Scenario
    public static void samplingWhenBadArgumentsThenNamed(List<String> log) {
        expect(IllegalArgumentException.class, "logits must have a non-empty last dimension",
                () -> Sampling.sampleNext(Tensor.of(new float[0], 2, 0), 0.0, 0.9));
        expect(IllegalArgumentException.class, "logits must have a non-empty last dimension",
                () -> Sampling.sampleNext(Tensor.of(new double[0], 0), 1.0, 0.9));
        expect(IllegalArgumentException.class, "logits must be Float or Double: Tensor(dtype=Int32, shape=[1, 3])",
                () -> Sampling.sampleNext(Tensor.of(new int[] {1, 2, 3}, 1, 3), 0.0, 0.9));
        expect(IllegalArgumentException.class, "logits must be Float or Double: Tensor(dtype=Int64",
                () -> Sampling.sampleNext(Tensor.of(new long[] {1, 2}), 1.0, 0.9));
        expect(IllegalArgumentException.class, "logits must be Float or Double: Tensor(dtype=Bool",
                () -> Sampling.sampleNext(Tensor.of(new boolean[] {true}), 0.0, 0.9));

        Tensor l3 = Tensor.of(new long[] {1, 2, 3});
        expect(IllegalArgumentException.class, "textMask must be Bool: Tensor(dtype=Int8, shape=[3])",
                () -> Sampling.mergeWithPromptMask(Tensor.of(new byte[] {1, 0, 1}), l3, l3));
        expect(IllegalArgumentException.class, "textMask must be Bool: Tensor(dtype=Int64",
                () -> Sampling.mergeWithPromptMask(l3, l3, l3));
        expect(IllegalArgumentException.class, "textMask, currentTokens and nextToken must hold as many elements",
                () -> Sampling.mergeWithPromptMask(Tensor.of(new boolean[] {true, false}), l3, l3));
        expect(IllegalArgumentException.class, "must hold as many elements",
                () -> Sampling.mergeWithPromptMask(Tensor.of(new boolean[3]), l3, Tensor.of(new long[] {1, 2})));
        expect(IllegalArgumentException.class, "must hold as many elements",
                () -> Sampling.mergeWithPromptMask(Tensor.of(new boolean[2]), Tensor.of(new long[] {1, 2}), l3));
        expect(IllegalArgumentException.class,
                "currentTokens and nextToken must both be Int32 or both Int64: Tensor(dtype=Int32",
                () -> Sampling.mergeWithPromptMask(Tensor.of(new boolean[3]), Tensor.of(new int[] {1, 2, 3}), l3));
        expect(IllegalArgumentException.class, "must both be Int32 or both Int64",
                () -> Sampling.mergeWithPromptMask(Tensor.of(new boolean[3]), l3, Tensor.of(new int[] {1, 2, 3})));
        expect(IllegalArgumentException.class, "must both be Int32 or both Int64",
                () -> Sampling.mergeWithPromptMask(Tensor.of(new boolean[3]), Tensor.of(new float[3]),
                        Tensor.of(new float[3])));
        log.add("refused by name");
    }
}
