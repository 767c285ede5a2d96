package smile.llm;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * The settings of one request, an immutable value built with {@link #builder()}: the Java form of Python's
 * {@code smile_llm.serving.request.SamplingParams}, one builder method per Python field (the Python name in
 * parentheses below). The defaults are Python's.
 *
 * <p>The builder does not check values (but for an empty {@code choice} list, refused by {@link Builder#build()}).
 * A request is validated once, in Python, when it is created (by
 * {@link smile.llm.python.PythonLanguageModel#generate(int[], SamplingParams, GenerationListener)},
 * {@code submit}, {@code stream}, {@code chat}, ...): a bad value is an {@link IllegalArgumentException} whose
 * message names the field by its Java and Python names, for example
 * {@code "topK (top_k) must be >= 0 (0: off), got -1"}, and nothing is queued.
 *
 * <ul>
 * <li>{@code maxNewTokens} (max_new_tokens, 256): most new tokens, {@code >= 0}.
 * <li>{@code temperature} (0.0): 0 is greedy; finite and {@code >= 0}.
 * <li>{@code topP} (top_p, 1.0): nucleus sampling, in (0, 1].
 * <li>{@code topK} (top_k, 0): keep the k most likely tokens, 0 for off.
 * <li>{@code minP} (min_p, 0.0): drop tokens below {@code minP} times the top probability, in [0, 1].
 * <li>{@code seed} (0): 0 is nondeterministic; any other seed reproduces the output (read as unsigned 64 bits).
 * <li>{@code logprobs} (false): null for none; 0 for each chosen token's logprob; k in 1..20 for the top-k
 *     alternatives as well ({@link Completion#topLogprobs()}).
 * <li>{@code promptLogprobs} (prompt_logprobs, null): k in 0..20 for each prompt token's logprob and its top-k
 *     alternatives ({@link Completion#promptLogprobs()}).
 * <li>{@code stop} (stop, none): stop strings and stop token ids (EOS always stops).
 * <li>{@code repetitionPenalty} (repetition_penalty, 1.0, Hugging Face's, {@code > 0}),
 *     {@code presencePenalty} and {@code frequencyPenalty} (presence_penalty, frequency_penalty, 0.0, OpenAI's,
 *     in [-2, 2]), {@code logitBias} (logit_bias, token id to a bias in [-100, 100]), {@code minNewTokens}
 *     (min_new_tokens, 0: EOS is masked until then).
 * <li>{@code speculativeTokens} (speculative_tokens, null: the drafter's default; 0: plain decoding), or
 *     {@code speculativeTokensAuto()} (speculative_tokens="auto": the model's draft policy chooses the drafts of
 *     every round), and {@code draftSampling} (draft_sampling, "greedy" or "sample").
 * <li>{@code draftTree} (draft_tree, none): a token tree of drafts per round, the number of alternatives at each
 *     depth, for example {@code draftTree(3, 2, 2)}: 1..7 depths of 1..8 alternatives, at most 32 nodes; the
 *     model's drafter must propose trees (the MTP drafters do). Its depth is the round's drafts, so leave
 *     {@code speculativeTokens} null (or set it to the depth).
 * <li>{@code n} (1): samples of one prompt, sharing its KV; more than one only through
 *     {@link smile.llm.python.PythonLanguageModel#generateSamples}.
 * <li>Constrained output, at most one of: {@code jsonSchema} (json_schema, null): the text of a JSON schema the
 *     output must follow (laid out as {@code json.dumps} does, {@code ", "} and {@code ": "});
 *     {@code jsonObject} (json_object, false): any JSON object; {@code regex} (regex, null): a regular expression
 *     the whole output must match; {@code grammar} (grammar, null): a Lark grammar in llguidance's syntax;
 *     {@code choice} (choice, none): the output is one of these strings. The allowed tokens are masked before the
 *     processors and warpers, and the request stops when the constraint is complete; the stats
 *     ({@link Completion#statsJson()}) gain {@code forced_tokens} and {@code constraint_complete}. A constraint
 *     the grammar engine refuses (a regex or grammar with an error, a schema it cannot compile), an empty string,
 *     or two constraints at once is an {@link IllegalArgumentException} at the call, nothing queued, whose message
 *     names the field and quotes the engine's, for example {@code "regex: the grammar engine refused it: ..."},
 *     {@code "jsonSchema (json_schema): the grammar engine refused it: ..."} or {@code "choice: give one
 *     constraint per request, got regex and choice"}. Null (or, for {@code jsonObject}, false) leaves a field
 *     unset, and its accessor then answers null (false, an empty {@code choice} list).
 * <li>{@code segments} (segments, none): pieces laid out before the prompt, in order: a {@code String} (text), an
 *     {@code int[]} (token ids, kept as a {@code List<Integer>}) or a {@link smile.llm.python.Segment} from
 *     {@link smile.llm.python.PythonLanguageModel#registerSegment(String)}, whose KV is spliced at the next page
 *     boundary (the text before it padded) instead of computed. A released segment, another model's, a piece of
 *     another type or {@code promptLogprobs} with segments is an {@link IllegalArgumentException} at the call.
 * </ul>
 */
public final class SamplingParams {
    private final int maxNewTokens;
    private final double temperature;
    private final double topP;
    private final long seed;
    private final Integer logprobs;
    private final List<String> stop;
    private final List<Integer> stopTokenIds;
    private final Integer speculativeTokens;
    private final String draftSampling;
    private final int topK;
    private final double minP;
    private final double repetitionPenalty;
    private final double presencePenalty;
    private final double frequencyPenalty;
    private final Map<Integer, Double> logitBias;
    private final int minNewTokens;
    private final int n;
    private final Integer promptLogprobs;
    private final boolean speculativeTokensAuto;
    private final List<Integer> draftTree;
    private final String jsonSchema;
    private final boolean jsonObject;
    private final String regex;
    private final String grammar;
    private final List<String> choice;
    private final List<Object> segments;

    private SamplingParams(Builder b) {
        maxNewTokens = b.maxNewTokens;
        temperature = b.temperature;
        topP = b.topP;
        seed = b.seed;
        logprobs = b.logprobs;
        stop = Collections.unmodifiableList(new ArrayList<>(b.stop));
        stopTokenIds = Collections.unmodifiableList(new ArrayList<>(b.stopTokenIds));
        speculativeTokens = b.speculativeTokens;
        draftSampling = b.draftSampling;
        topK = b.topK;
        minP = b.minP;
        repetitionPenalty = b.repetitionPenalty;
        presencePenalty = b.presencePenalty;
        frequencyPenalty = b.frequencyPenalty;
        logitBias = Collections.unmodifiableMap(new LinkedHashMap<>(b.logitBias));
        minNewTokens = b.minNewTokens;
        n = b.n;
        promptLogprobs = b.promptLogprobs;
        speculativeTokensAuto = b.speculativeTokensAuto;
        draftTree = Collections.unmodifiableList(new ArrayList<>(b.draftTree));
        jsonSchema = b.jsonSchema;
        jsonObject = b.jsonObject;
        regex = b.regex;
        grammar = b.grammar;
        choice = b.choice == null ? Collections.emptyList() : Collections.unmodifiableList(new ArrayList<>(b.choice));
        segments = Collections.unmodifiableList(new ArrayList<>(b.segments));
    }

    /** A builder holding Python's defaults. */
    public static Builder builder() {
        return new Builder();
    }

    /** Python's defaults (256 new tokens, greedy). */
    public static SamplingParams defaults() {
        return builder().build();
    }

    /** A builder holding this value's settings. */
    public Builder toBuilder() {
        Builder b = new Builder();
        b.maxNewTokens = maxNewTokens;
        b.temperature = temperature;
        b.topP = topP;
        b.seed = seed;
        b.logprobs = logprobs;
        b.stop.addAll(stop);
        b.stopTokenIds.addAll(stopTokenIds);
        b.speculativeTokens = speculativeTokens;
        b.draftSampling = draftSampling;
        b.topK = topK;
        b.minP = minP;
        b.repetitionPenalty = repetitionPenalty;
        b.presencePenalty = presencePenalty;
        b.frequencyPenalty = frequencyPenalty;
        b.logitBias.putAll(logitBias);
        b.minNewTokens = minNewTokens;
        b.n = n;
        b.promptLogprobs = promptLogprobs;
        b.speculativeTokensAuto = speculativeTokensAuto;
        b.draftTree.addAll(draftTree);
        b.jsonSchema = jsonSchema;
        b.jsonObject = jsonObject;
        b.regex = regex;
        b.grammar = grammar;
        b.choice = choice.isEmpty() ? null : new ArrayList<>(choice);
        b.segments.addAll(segments);
        return b;
    }

    public int maxNewTokens() { return maxNewTokens; }
    public double temperature() { return temperature; }
    public double topP() { return topP; }
    public long seed() { return seed; }
    /** Null: no logprobs; 0: the chosen tokens' logprobs; k: also the top-k alternatives. */
    public Integer logprobs() { return logprobs; }
    /** Stop strings (unmodifiable). */
    public List<String> stop() { return stop; }
    /** Stop token ids (unmodifiable). */
    public List<Integer> stopTokenIds() { return stopTokenIds; }
    /** Null: the drafter's default (or the draft policy's choice when {@link #speculativeTokensAuto()}). */
    public Integer speculativeTokens() { return speculativeTokens; }
    /** True: the model's draft policy chooses the drafts of every round (speculative_tokens="auto"). */
    public boolean speculativeTokensAuto() { return speculativeTokensAuto; }
    /** Alternatives per depth of a token-tree round (unmodifiable); empty for linear drafts. */
    public List<Integer> draftTree() { return draftTree; }
    public String draftSampling() { return draftSampling; }
    public int topK() { return topK; }
    public double minP() { return minP; }
    public double repetitionPenalty() { return repetitionPenalty; }
    public double presencePenalty() { return presencePenalty; }
    public double frequencyPenalty() { return frequencyPenalty; }
    /** Token id to bias (unmodifiable, in insertion order). */
    public Map<Integer, Double> logitBias() { return logitBias; }
    public int minNewTokens() { return minNewTokens; }
    public int n() { return n; }
    /** Null: no prompt logprobs. */
    public Integer promptLogprobs() { return promptLogprobs; }
    /** The JSON schema (its JSON text) the output must follow; null when unset. */
    public String jsonSchema() { return jsonSchema; }
    /** True: the output is a JSON object (any). */
    public boolean jsonObject() { return jsonObject; }
    /** The regular expression the whole output must match; null when unset. */
    public String regex() { return regex; }
    /** The Lark grammar (llguidance's syntax) the output must follow; null when unset. */
    public String grammar() { return grammar; }
    /** The strings the output must be one of (unmodifiable); empty when unset. */
    public List<String> choice() { return choice; }
    /**
     * The pieces laid out before the prompt (unmodifiable): {@code String}s, token ids as {@code List<Integer>}
     * and {@link smile.llm.python.Segment}s; empty when unset.
     */
    public List<Object> segments() { return segments; }

    @Override
    public boolean equals(Object o) {
        if (this == o) return true;
        if (!(o instanceof SamplingParams)) return false;
        SamplingParams p = (SamplingParams) o;
        return maxNewTokens == p.maxNewTokens && Double.compare(temperature, p.temperature) == 0
                && Double.compare(topP, p.topP) == 0 && seed == p.seed && Objects.equals(logprobs, p.logprobs)
                && stop.equals(p.stop) && stopTokenIds.equals(p.stopTokenIds)
                && Objects.equals(speculativeTokens, p.speculativeTokens)
                && Objects.equals(draftSampling, p.draftSampling) && topK == p.topK
                && Double.compare(minP, p.minP) == 0 && Double.compare(repetitionPenalty, p.repetitionPenalty) == 0
                && Double.compare(presencePenalty, p.presencePenalty) == 0
                && Double.compare(frequencyPenalty, p.frequencyPenalty) == 0 && logitBias.equals(p.logitBias)
                && minNewTokens == p.minNewTokens && n == p.n && Objects.equals(promptLogprobs, p.promptLogprobs)
                && speculativeTokensAuto == p.speculativeTokensAuto && draftTree.equals(p.draftTree)
                && Objects.equals(jsonSchema, p.jsonSchema) && jsonObject == p.jsonObject
                && Objects.equals(regex, p.regex) && Objects.equals(grammar, p.grammar)
                && choice.equals(p.choice) && segments.equals(p.segments);
    }

    @Override
    public int hashCode() {
        return Objects.hash(maxNewTokens, temperature, topP, seed, logprobs, stop, stopTokenIds, speculativeTokens,
                draftSampling, topK, minP, repetitionPenalty, presencePenalty, frequencyPenalty, logitBias,
                minNewTokens, n, promptLogprobs, speculativeTokensAuto, draftTree, jsonSchema, jsonObject, regex,
                grammar, choice, segments);
    }

    @Override
    public String toString() {
        return "SamplingParams[maxNewTokens=" + maxNewTokens + ", temperature=" + temperature + ", topP=" + topP
                + ", seed=" + seed + ", logprobs=" + logprobs + ", stop=" + stop + ", stopTokenIds=" + stopTokenIds
                + ", speculativeTokens=" + speculativeTokens + ", draftSampling=" + draftSampling + ", topK=" + topK
                + ", minP=" + minP + ", repetitionPenalty=" + repetitionPenalty + ", presencePenalty="
                + presencePenalty + ", frequencyPenalty=" + frequencyPenalty + ", logitBias=" + logitBias
                + ", minNewTokens=" + minNewTokens + ", n=" + n + ", promptLogprobs=" + promptLogprobs
                + ", speculativeTokensAuto=" + speculativeTokensAuto + ", draftTree=" + draftTree + ", jsonSchema="
                + jsonSchema + ", jsonObject=" + jsonObject + ", regex=" + regex + ", grammar=" + grammar
                + ", choice=" + choice + ", segments=" + segments + "]";
    }

    /** A mutable builder; each method sets one field (see the class comment) and returns this builder. */
    public static final class Builder {
        private int maxNewTokens = 256;
        private double temperature = 0.0;
        private double topP = 1.0;
        private long seed = 0;
        private Integer logprobs = null;
        private final List<String> stop = new ArrayList<>();
        private final List<Integer> stopTokenIds = new ArrayList<>();
        private Integer speculativeTokens = null;
        private String draftSampling = "greedy";
        private int topK = 0;
        private double minP = 0.0;
        private double repetitionPenalty = 1.0;
        private double presencePenalty = 0.0;
        private double frequencyPenalty = 0.0;
        private final Map<Integer, Double> logitBias = new LinkedHashMap<>();
        private int minNewTokens = 0;
        private int n = 1;
        private Integer promptLogprobs = null;
        private boolean speculativeTokensAuto = false;
        private final List<Integer> draftTree = new ArrayList<>();
        private String jsonSchema = null;
        private boolean jsonObject = false;
        private String regex = null;
        private String grammar = null;
        private List<String> choice = null;
        private final List<Object> segments = new ArrayList<>();

        private Builder() {}

        public Builder maxNewTokens(int v) { maxNewTokens = v; return this; }
        public Builder temperature(double v) { temperature = v; return this; }
        public Builder topP(double v) { topP = v; return this; }
        public Builder seed(long v) { seed = v; return this; }
        /** True: each chosen token's logprob (the same as {@code logprobs(0)}); false: none. */
        public Builder logprobs(boolean v) { logprobs = v ? 0 : null; return this; }
        /** Each chosen token's logprob and its {@code k} most likely alternatives (0: the chosen token's only). */
        public Builder logprobs(int k) { logprobs = k; return this; }
        /** Each prompt token's logprob and its {@code k} most likely alternatives; null for none. */
        public Builder promptLogprobs(Integer k) { promptLogprobs = k; return this; }
        /** Stop strings, replacing earlier ones (null: none). */
        public Builder stop(List<String> texts) {
            stop.clear();
            if (texts != null) stop.addAll(texts);
            return this;
        }
        /** Stop strings, replacing earlier ones. */
        public Builder stop(String... texts) { return stop(texts == null ? null : java.util.Arrays.asList(texts)); }
        /** Stop token ids, replacing earlier ones (EOS always stops). */
        public Builder stopTokenIds(int... ids) {
            stopTokenIds.clear();
            if (ids != null) for (int id : ids) stopTokenIds.add(id);
            return this;
        }
        /**
         * Drafts per speculative round; null for the drafter's default, 0 for plain decoding. Clears
         * {@link #speculativeTokensAuto()}.
         */
        public Builder speculativeTokens(Integer v) {
            speculativeTokens = v;
            speculativeTokensAuto = false;
            return this;
        }
        /**
         * The model's draft policy chooses the drafts of every round, from 0 (a plain step) up to the drafter's
         * budget (speculative_tokens="auto"); {@link #speculativeTokens(Integer)} undoes it.
         */
        public Builder speculativeTokensAuto() {
            speculativeTokens = null;
            speculativeTokensAuto = true;
            return this;
        }
        /**
         * A token tree of drafts per round: the number of alternatives at each depth, for example
         * {@code draftTree(3, 2, 2)}; replaces an earlier tree, and null or none clears it (linear drafts).
         */
        public Builder draftTree(int... branching) {
            draftTree.clear();
            if (branching != null) for (int b : branching) draftTree.add(b);
            return this;
        }
        /** "greedy" or "sample". */
        public Builder draftSampling(String v) { draftSampling = v; return this; }
        public Builder topK(int v) { topK = v; return this; }
        public Builder minP(double v) { minP = v; return this; }
        public Builder repetitionPenalty(double v) { repetitionPenalty = v; return this; }
        public Builder presencePenalty(double v) { presencePenalty = v; return this; }
        public Builder frequencyPenalty(double v) { frequencyPenalty = v; return this; }
        /** Token id to bias, replacing earlier biases (null: none). */
        public Builder logitBias(Map<Integer, Double> bias) {
            logitBias.clear();
            if (bias != null) logitBias.putAll(bias);
            return this;
        }
        public Builder minNewTokens(int v) { minNewTokens = v; return this; }
        /** Samples of the prompt, for {@link smile.llm.python.PythonLanguageModel#generateSamples}. */
        public Builder n(int v) { n = v; return this; }
        /**
         * The output follows this JSON schema, given as its JSON text (for example
         * {@code {"type": "object", "properties": {...}}}); null clears it. At most one constraint per request.
         */
        public Builder jsonSchema(String schema) { jsonSchema = schema; return this; }
        /** True: the output is a JSON object (any); false clears it. At most one constraint per request. */
        public Builder jsonObject(boolean v) { jsonObject = v; return this; }
        /** The whole output matches this regular expression; null clears it. At most one constraint per request. */
        public Builder regex(String pattern) { regex = pattern; return this; }
        /**
         * The output follows this Lark grammar in llguidance's syntax (its rule {@code start}); null clears it. At
         * most one constraint per request.
         */
        public Builder grammar(String lark) { grammar = lark; return this; }
        /**
         * The output is one of these strings, replacing earlier ones; null clears it, and an empty list is refused
         * by {@link #build()} (it would allow no output). At most one constraint per request.
         */
        public Builder choice(List<String> options) {
            choice = options == null ? null : new ArrayList<>(options);
            return this;
        }
        /** The output is one of these strings (see {@link #choice(List)}); a null array clears it. */
        public Builder choice(String... options) {
            return choice(options == null ? null : java.util.Arrays.asList(options));
        }
        /**
         * Pieces laid out before the prompt, replacing earlier ones (null or none clears them): {@code String} text,
         * {@code int[]} token ids (copied, kept as a {@code List<Integer>}) and registered
         * {@link smile.llm.python.Segment}s, for example {@code segments("Context:\n", manual, "\n", faq)}. Each
         * segment starts at the next page boundary of the pool; Python checks the pieces when a call makes the
         * request.
         */
        public Builder segments(Object... pieces) {
            return segments(pieces == null ? null : java.util.Arrays.asList(pieces));
        }
        /** {@link #segments(Object...)} from a list. */
        public Builder segments(List<?> pieces) {
            segments.clear();
            if (pieces != null) {
                for (Object piece : pieces) {
                    if (piece instanceof int[]) {
                        List<Integer> ids = new ArrayList<>();
                        for (int id : (int[]) piece) ids.add(id);
                        segments.add(Collections.unmodifiableList(ids));
                    } else {
                        segments.add(piece);
                    }
                }
            }
            return this;
        }

        /**
         * The value; the builder may be reused. {@link IllegalArgumentException} for an empty {@link #choice(List)}
         * (the one check made here; Python checks the rest when a call makes the request).
         */
        public SamplingParams build() {
            if (choice != null && choice.isEmpty()) {
                throw new IllegalArgumentException("choice: must hold at least one string (null clears it)");
            }
            return new SamplingParams(this);
        }
    }
}
