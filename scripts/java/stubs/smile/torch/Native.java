package smile.torch;

import smile.deep.tensor.Tensor;

/** Stub of Smile's native LibTorch calls (out of the bridge's scope). */
public final class Native {
    private Native() {}

    public static void copy_(Tensor dst, Tensor src) { throw new UnsupportedOperationException(); }
    public static long[] cudaMemGetInfo(int device) { throw new UnsupportedOperationException(); }
    public static long[] cudaAllocatorStats(int device) { throw new UnsupportedOperationException(); }
}
