package smile.deep.tensor;

/**
 * Where the device calls that need the Python process go (today {@link Device#emptyCache()}). Not part of Smile's
 * API: {@code smile.llm.python.Bridge.registerFactory} installs the launcher's factory here, so {@link Device} reaches
 * Python without depending on {@code smile.llm.python} (which depends on this package).
 */
public final class DeviceRuntime {
    /** The Python side of the device calls. */
    public interface Backend {
        /**
         * Releases the cached, unoccupied blocks of the allocator of {@code device} (torch's device string, such
         * as {@code "cuda:0"} or {@code "mps"}).
         */
        void emptyCache(String device);
    }

    private static volatile Backend backend;

    private DeviceRuntime() {}

    /** Installs {@code b} as the backend of the device calls ({@code null} removes it). */
    public static void install(Backend b) {
        backend = b;
    }

    /** The installed backend, or {@code null} when no Python process serves this JVM. */
    public static Backend backend() {
        return backend;
    }
}
