package smile.llm.parallel;

/** Stub (out of the bridge's scope). */
public class TensorParallelGroup implements AutoCloseable {
    public TensorParallelGroup(ParallelConfig config) { throw new UnsupportedOperationException(); }
    public ParallelState state(int rank) { throw new UnsupportedOperationException(); }

    @Override
    public void close() {}
}
