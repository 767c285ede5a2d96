package smile.llm.model.qwen;

import smile.llm.cache.KvCacheLayout;
import smile.llm.parallel.TensorShardSpec;

/** Stub of Smile's Qwen hyperparameters (out of the bridge's scope). */
public record QwenModelArgs(int numLayers, int numHeads, int numKvHeads, int intermediateSize, int vocabSize,
                            int maxBatchSize, int maxSeqLen, int linearNumKeyHeads, int linearNumValueHeads,
                            int linearKeyHeadDim, int linearValueHeadDim, int linearConvKernelDim) {
    public static QwenModelArgs fromHuggingFace(String configJson, int maxBatchSize, int maxSeqLen) {
        throw new UnsupportedOperationException();
    }

    public int numLinearAttentionLayers() { throw new UnsupportedOperationException(); }
    public int numFullAttentionLayers() { throw new UnsupportedOperationException(); }
    public int linearConvDim(TensorShardSpec shard) { throw new UnsupportedOperationException(); }
    public KvCacheLayout kvCacheLayout(TensorShardSpec shard) { throw new UnsupportedOperationException(); }
}
