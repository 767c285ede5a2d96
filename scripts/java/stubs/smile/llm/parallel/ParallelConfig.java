package smile.llm.parallel;

/** Stub of Smile's tensor-parallel configuration (out of the bridge's scope). */
public record ParallelConfig(byte[] devices) {
    public static ParallelConfig single(byte device) { throw new UnsupportedOperationException(); }
    public static ParallelConfig tensorParallel(byte... devices) { throw new UnsupportedOperationException(); }
    public boolean isTensorParallel() { throw new UnsupportedOperationException(); }
    public int tpSize() { throw new UnsupportedOperationException(); }
}
