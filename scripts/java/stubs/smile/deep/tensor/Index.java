package smile.deep.tensor;

/** Stub of Smile's LibTorch tensor index (out of the bridge's scope). */
public class Index implements AutoCloseable {
    public static final Index Colon = null;
    public static final Index Ellipsis = null;
    public static final Index None = null;

    public static Index slice(int start, int end) { throw new UnsupportedOperationException(); }
    public static Index slice(long start, long end) { throw new UnsupportedOperationException(); }
    public static Index of(int... indices) { throw new UnsupportedOperationException(); }
    public static Index of(long... indices) { throw new UnsupportedOperationException(); }
    @Override
    public void close() {}
}
