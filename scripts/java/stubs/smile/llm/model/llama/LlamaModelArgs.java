package smile.llm.model.llama;

import smile.llm.cache.KvCacheLayout;

/** Stub of Smile's Llama hyperparameters (out of the bridge's scope). */
public record LlamaModelArgs(int dim, int numLayers, int numHeads, Integer numKvHeads, int vocabSize,
                             int intermediateSize, int multipleOf, Double ffnDimMultiplier, double normEps,
                             double ropeTheta, boolean scaledRope, int maxBatchSize, int maxSeqLen) {
    public static LlamaModelArgs from(String paramsJson, int maxBatchSize, int maxSeqLen) {
        throw new UnsupportedOperationException();
    }

    public static LlamaModelArgs fromHuggingFace(String configJson, int maxBatchSize, int maxSeqLen) {
        throw new UnsupportedOperationException();
    }

    public int resolvedNumKvHeads() { throw new UnsupportedOperationException(); }
    public KvCacheLayout kvCacheLayout() { throw new UnsupportedOperationException(); }
}
