package smile.torch;

/** Stub of Smile's jextract binding of its native LibTorch shim (out of the bridge's scope). */
public final class smile_torch_h {
    private smile_torch_h() {}

    public static void smile_manual_seed(long seed) { throw new UnsupportedOperationException(); }
    public static void smile_set_default_dtype(int dtype) { throw new UnsupportedOperationException(); }
}
