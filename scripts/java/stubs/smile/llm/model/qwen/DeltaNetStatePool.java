package smile.llm.model.qwen;

import smile.deep.tensor.Device;
import smile.deep.tensor.ScalarType;

/** Stub of Smile's Gated DeltaNet recurrent-state pool (LibTorch, out of the bridge's scope). */
public class DeltaNetStatePool implements AutoCloseable {
    public DeltaNetStatePool(int numLayers, int numValueHeads, int keyHeadDim, int valueHeadDim, int convDim,
                             int convKernelDim, int maxBatchSize, Device device, ScalarType recurrentDtype,
                             ScalarType convDtype) {
        throw new UnsupportedOperationException();
    }

    public void reset(int batchSize) { throw new UnsupportedOperationException(); }
    public void bindRequest(int requestId) { throw new UnsupportedOperationException(); }
    public void unbindRequest(int requestId) { throw new UnsupportedOperationException(); }
    public void unbind() { throw new UnsupportedOperationException(); }
    public void activateStep(int... requestIds) { throw new UnsupportedOperationException(); }
    public void scatterActive() { throw new UnsupportedOperationException(); }

    @Override
    public void close() {}
}
