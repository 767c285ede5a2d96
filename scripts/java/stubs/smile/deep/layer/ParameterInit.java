package smile.deep.layer;

import smile.deep.tensor.Device;

/** Stub of Smile's LibTorch parameter initialisation (out of the bridge's scope). */
public final class ParameterInit {
    private ParameterInit() {}

    public static AutoCloseable uninitialized(Device device) { throw new UnsupportedOperationException(); }
}
