package smile.llm.model.qwen;

import smile.deep.tensor.Tensor;
import smile.llm.parallel.TensorShardSpec;

/** Stub (out of the bridge's scope). */
public final class QwenWeightShard {
    private QwenWeightShard() {}

    public static Tensor shard(String name, Tensor value, QwenModelArgs args, TensorShardSpec shard) {
        throw new UnsupportedOperationException();
    }
}
