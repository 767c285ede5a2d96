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
    /** @throws IllegalArgumentException unless every field is {@code >= 1} (Smile's record checks nothing). */
    public KvCacheLayout {
        if (numLayers < 1 || numKvHeads < 1 || headDim < 1 || maxBatchSize < 1 || maxSeqLen < 1) {
            throw new IllegalArgumentException("every KvCacheLayout field must be >= 1: " + numLayers + ", "
                    + numKvHeads + ", " + headDim + ", " + maxBatchSize + ", " + maxSeqLen);
        }
    }

    /**
     * Smile's {@code KvCacheLayout.of}: the layout of a dense decoder with {@code numHeads} query heads over a model
     * dimension {@code dim}, so {@code headDim = dim / numHeads}; {@code numKvHeads == null} means {@code numHeads}
     * (no grouped-query attention). Python's {@code KvCacheLayout.of} with every argument given.
     *
     * @throws IllegalArgumentException if {@code numHeads < 1}, {@code dim} is not a multiple of {@code numHeads},
     *         or a resulting field is below 1.
     */
    public static KvCacheLayout of(int numLayers, int dim, int numHeads, Integer numKvHeads, int maxBatchSize,
                                   int maxSeqLen) {
        if (numHeads < 1) {
            throw new IllegalArgumentException("numHeads must be >= 1, got " + numHeads);
        }
        if (dim % numHeads != 0) {
            throw new IllegalArgumentException("dim " + dim + " is not divisible by numHeads " + numHeads
                    + "; pick a head count that divides it");
        }
        int kvHeads = numKvHeads == null ? numHeads : numKvHeads;
        return new KvCacheLayout(numLayers, kvHeads, dim / numHeads, maxBatchSize, maxSeqLen);
    }
}
