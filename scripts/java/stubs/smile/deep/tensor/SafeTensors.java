package smile.deep.tensor;

import java.util.List;
import java.util.Map;

/** Stub of Smile's LibTorch safetensors reader (out of the bridge's scope). */
public class SafeTensors implements AutoCloseable {
    public static SafeTensors read(String path, Device device, List<String> keys) {
        throw new UnsupportedOperationException();
    }

    public static List<String> listTensors(String path) { throw new UnsupportedOperationException(); }
    public Map<String, Tensor> tensors() { throw new UnsupportedOperationException(); }

    @Override
    public void close() {}
}
