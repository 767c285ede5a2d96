package bridgetest.apps;

/** main throws: the launcher prints the Java stack trace and exits 1. */
public class ThrowsApp {
    public static void main(String[] args) {
        fail(args.length);
    }

    static void fail(int n) {
        throw new IllegalStateException("ThrowsApp failed on purpose with " + n + " args");
    }
}
