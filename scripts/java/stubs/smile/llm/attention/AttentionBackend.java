package smile.llm.attention;

/** Stub of Smile's attention kernels' choice (out of the bridge's scope). */
public enum AttentionBackend {
    SDPA, FLASHINFER;

    public static AttentionBackend parse(String name) { throw new UnsupportedOperationException(); }
}
