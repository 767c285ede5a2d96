package smile.llm.parallel;

/** Stub (out of the bridge's scope). */
public final class ParallelState {
    private ParallelState() {}

    public static void setCurrent(ParallelState state) { throw new UnsupportedOperationException(); }
    public static void clearCurrent() { throw new UnsupportedOperationException(); }
}
