package smile.llm.cache;

/**
 * Geometry of a KV cache: layers, KV heads, head dimension, and the batch and sequence the pool is sized for.
 *
 * @param numLayers the number of attention layers.
 * @param numKvHeads the number of key/value heads.
 * @param headDim the head dimension.
 * @param maxBatchSize the number of requests the pool is sized for.
 * @param maxSeqLen the longest sequence (prompt plus completion) of one request.
 */
public record KvCacheLayout(int numLayers, int numKvHeads, int headDim, int maxBatchSize, int maxSeqLen) {
    public KvCacheLayout {
        if (numLayers < 1 || numKvHeads < 1 || headDim < 1 || maxBatchSize < 1 || maxSeqLen < 1) {
            throw new IllegalArgumentException("every KvCacheLayout field must be >= 1: " + numLayers + ", "
                    + numKvHeads + ", " + headDim + ", " + maxBatchSize + ", " + maxSeqLen);
        }
    }
}
