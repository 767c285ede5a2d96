package smile.util;

/** Stub of Smile's scope of closeable resources (out of the bridge's scope). */
public class AutoScope implements AutoCloseable {
    public AutoScope(AutoCloseable... resources) {}

    public <T extends AutoCloseable> T add(T resource) { throw new UnsupportedOperationException(); }

    @Override
    public void close() {}
}
