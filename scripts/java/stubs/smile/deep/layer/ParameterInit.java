package smile.deep.layer;

import smile.deep.tensor.Device;

/** Stub of Smile's LibTorch parameter initialisation (out of the bridge's scope). */
public final class ParameterInit {
    private ParameterInit() {}

    public static Scope uninitialized(Device device) { throw new UnsupportedOperationException(); }

    /** Smile's scope handle: its {@code close()} throws no checked exception. */
    public enum Scope implements AutoCloseable {
        INSTANCE;

        @Override
        public void close() {}
    }
}
