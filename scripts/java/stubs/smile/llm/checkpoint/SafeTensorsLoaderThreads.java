package smile.llm.checkpoint;

/** Stub (out of the bridge's scope). */
public final class SafeTensorsLoaderThreads {
    private SafeTensorsLoaderThreads() {}

    public static int resolve(int requested, int shards) { throw new UnsupportedOperationException(); }
}
