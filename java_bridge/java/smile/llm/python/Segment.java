package smile.llm.python;

/**
 * A token segment (a document, a tool description) registered with a {@link PythonLanguageModel} by
 * {@link PythonLanguageModel#registerSegment(String)}: its KV is computed once, at position 0, and kept in the
 * model's pool until {@link PythonLanguageModel#releaseSegment(Segment)}. Name it among a request's
 * {@link smile.llm.SamplingParams.Builder#segments(Object...)} pieces and the request splices the kept KV (at the
 * next page boundary, its keys turned by the RoPE delta of that position) instead of computing it. Python's
 * {@code smile_llm.Segment} (see {@code docs/segments.md}); implemented by the bridge, compared by identity.
 */
public interface Segment {
    /** The segment's id: positive, never reused by its model. */
    int id();

    /** Its token ids (a new array each call). */
    int[] tokens();

    /** Its number of tokens. */
    int length();
}
