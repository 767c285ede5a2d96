package smile.llm.parallel;

/** Stub (out of the bridge's scope). */
public record TensorShardSpec(int tpSize, int tpRank, int linearNumValueHeads) {
    public static TensorShardSpec forRank(int tpSize, int rank, int numHeads, int numKvHeads, int intermediateSize,
                                          int linearNumKeyHeads, int linearNumValueHeads) {
        throw new UnsupportedOperationException();
    }
}
