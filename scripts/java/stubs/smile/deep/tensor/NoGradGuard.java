package smile.deep.tensor;

/** Stub of Smile's LibTorch no-grad guard (out of the bridge's scope). */
public class NoGradGuard implements AutoCloseable {
    @Override
    public void close() {}
}
