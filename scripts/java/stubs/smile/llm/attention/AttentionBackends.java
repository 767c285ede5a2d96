package smile.llm.attention;

/** Stub (out of the bridge's scope). */
public final class AttentionBackends {
    private AttentionBackends() {}

    public static void install(AttentionBackend backend) { throw new UnsupportedOperationException(); }
    public static AttentionBackend current() { throw new UnsupportedOperationException(); }
}
