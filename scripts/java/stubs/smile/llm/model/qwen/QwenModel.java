package smile.llm.model.qwen;

import java.util.List;
import java.util.Map;
import smile.deep.tensor.Device;
import smile.deep.tensor.Tensor;
import smile.llm.cache.KvCachePool;
import smile.llm.parallel.TensorParallelGroup;
import smile.llm.parallel.TensorShardSpec;

/** Stub of Smile's Qwen transformer module (LibTorch layers, out of the bridge's scope). */
public class QwenModel {
    public DeltaNetStatePool deltaNetStatePool;
    public List<QwenBlock> layers;

    public QwenModel(QwenModelArgs args, DeltaNetStatePool statePool, TensorShardSpec shard,
                     TensorParallelGroup tpGroup) {
        throw new UnsupportedOperationException();
    }

    public QwenModelArgs params() { throw new UnsupportedOperationException(); }
    public int tpRank() { throw new UnsupportedOperationException(); }
    public TensorShardSpec shard() { throw new UnsupportedOperationException(); }
    public DeltaNetStatePool deltaNetStatePool() { throw new UnsupportedOperationException(); }
    public Device device() { throw new UnsupportedOperationException(); }
    public QwenModel to(Device device) { throw new UnsupportedOperationException(); }
    public QwenModel eval() { throw new UnsupportedOperationException(); }
    public void setRequiresGrad(boolean requiresGrad) { throw new UnsupportedOperationException(); }
    public void loadStateDict(Map<String, Tensor> stateDict, boolean strict) { throw new UnsupportedOperationException(); }
    public KvCachePool kvCachePool() { throw new UnsupportedOperationException(); }
    public void setKvCachePool(KvCachePool pool, boolean owned) { throw new UnsupportedOperationException(); }
    public Tensor forward(Tensor tokens, int startPos, boolean allTokenLogits) {
        throw new UnsupportedOperationException();
    }
    public Tensor forward(Tensor tokens, int[] positions, boolean allTokenLogits) {
        throw new UnsupportedOperationException();
    }
}
