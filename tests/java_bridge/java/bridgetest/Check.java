package bridgetest;

import java.util.Arrays;
import java.util.Objects;

/** Assertions for the drivers: each failure is an AssertionError whose message says what differed. */
public final class Check {
    private Check() {}

    public static void check(boolean ok, String what) {
        if (!ok) throw new AssertionError(what);
    }

    public static void eq(long expected, long actual, String what) {
        if (expected != actual) throw new AssertionError(what + ": expected " + expected + ", got " + actual);
    }

    public static void eq(double expected, double actual, String what) {
        if (Double.compare(expected, actual) != 0) {
            throw new AssertionError(what + ": expected " + expected + ", got " + actual);
        }
    }

    public static void eq(Object expected, Object actual, String what) {
        if (!Objects.equals(expected, actual)) {
            throw new AssertionError(what + ": expected " + expected + ", got " + actual);
        }
    }

    public static void eq(int[] expected, int[] actual, String what) {
        if (!Arrays.equals(expected, actual)) {
            throw new AssertionError(what + ": expected " + Arrays.toString(expected) + ", got "
                    + Arrays.toString(actual));
        }
    }

    public static void eq(long[] expected, long[] actual, String what) {
        if (!Arrays.equals(expected, actual)) {
            throw new AssertionError(what + ": expected " + Arrays.toString(expected) + ", got "
                    + Arrays.toString(actual));
        }
    }

    /** A call expected to throw. */
    @FunctionalInterface
    public interface Call {
        void run() throws Throwable;
    }

    /** Runs {@code call}, which must throw exactly {@code type} (or a subclass) with a message containing
     *  {@code message}; returns the exception. */
    public static <T extends Throwable> T expect(Class<T> type, String message, Call call) {
        try {
            call.run();
        } catch (Throwable t) {
            if (!type.isInstance(t)) {
                AssertionError e = new AssertionError("expected " + type.getName() + ", got " + t);
                e.initCause(t);
                throw e;
            }
            String m = t.getMessage();
            if (message != null && (m == null || !m.contains(message))) {
                throw new AssertionError("expected a " + type.getSimpleName() + " message containing '" + message
                        + "', got '" + m + "'");
            }
            return type.cast(t);
        }
        throw new AssertionError("expected " + type.getName() + " (" + message + "), but the call returned");
    }
}
