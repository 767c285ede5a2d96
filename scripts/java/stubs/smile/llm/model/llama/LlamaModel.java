package smile.llm.model.llama;

import java.util.Map;
import smile.deep.tensor.Device;
import smile.deep.tensor.Tensor;
import smile.llm.cache.KvCachePool;

/** Stub of Smile's Llama transformer module (LibTorch layers, out of the bridge's scope). */
public class LlamaModel {
    public LlamaModel(int dim, int numLayers, int numHeads, int numKvHeads, int vocabSize, int intermediateSize,
                      int multipleOf, Double ffnDimMultiplier, double normEps, double ropeTheta, boolean scaledRope,
                      int maxSeqLen) {
        throw new UnsupportedOperationException();
    }

    public Device device() { throw new UnsupportedOperationException(); }
    public LlamaModel to(Device device) { throw new UnsupportedOperationException(); }
    public LlamaModel eval() { throw new UnsupportedOperationException(); }
    public void setRequiresGrad(boolean requiresGrad) { throw new UnsupportedOperationException(); }
    public void load(String path) { throw new UnsupportedOperationException(); }
    public void loadStateDict(Map<String, Tensor> stateDict, boolean strict) { throw new UnsupportedOperationException(); }
    public KvCachePool kvCachePool() { throw new UnsupportedOperationException(); }
    public void setKvCachePool(KvCachePool pool, boolean owned) { throw new UnsupportedOperationException(); }
    public Tensor forward(Tensor tokens, int startPos) { throw new UnsupportedOperationException(); }
    public Tensor forward(Tensor tokens, int[] positions) { throw new UnsupportedOperationException(); }
}
