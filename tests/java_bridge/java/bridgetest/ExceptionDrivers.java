package bridgetest;

import java.util.concurrent.CancellationException;
import smile.llm.ChatCompletion;
import smile.llm.GenerationListener;
import smile.llm.LanguageModel;
import smile.llm.cache.KvCachePool;
import smile.llm.python.PythonLanguageModel;

/**
 * Java callers of the Python implementations that catch what arrives and hand it back, so the tests can compare
 * the Java exception with the Python error it came from. Each returns the Throwable caught in Java, or throws
 * AssertionError if the call returned.
 */
public final class ExceptionDrivers {
    private ExceptionDrivers() {}

    private static Throwable none(String what) {
        throw new AssertionError(what + " returned instead of throwing");
    }

    public static Throwable bindRequest(KvCachePool pool, int[] prompt, int capacity) {
        try {
            pool.bindRequest(prompt, capacity);
        } catch (Throwable t) {
            return t;
        }
        return none("bindRequest");
    }

    public static Throwable activateStep(KvCachePool pool, int... ids) {
        try {
            pool.activateStep(ids);
        } catch (Throwable t) {
            return t;
        }
        return none("activateStep");
    }

    public static Throwable freePages(KvCachePool pool) {
        try {
            pool.freePages();
        } catch (Throwable t) {
            return t;
        }
        return none("freePages");
    }

    public static Throwable run(Runnable r) {
        try {
            r.run();
        } catch (Throwable t) {
            return t;
        }
        return none("run");
    }

    public static Throwable get(KvCachePool pool, int layer, int length) {
        try {
            Kv.get(pool, layer, length);
        } catch (Throwable t) {
            return t;
        }
        return none("get");
    }

    /** The typed catch clauses prove what the Java compiler sees: the declared checked type, or the wrapper. */
    public static String callChecked(CheckedService service, String what) {
        try {
            return "returned " + service.call(what);
        } catch (java.io.IOException e) {
            return "IOException " + e.getClass().getName() + ": " + e.getMessage();
        } catch (java.lang.reflect.UndeclaredThrowableException e) {
            Throwable c = e.getCause();
            return "UndeclaredThrowableException caused by " + c.getClass().getName() + ": " + c.getMessage();
        } catch (RuntimeException e) {
            return "RuntimeException " + e.getClass().getName() + ": " + e.getMessage();
        }
    }

    public static Throwable callCheckedThrowable(CheckedService service, String what) {
        try {
            service.call(what);
        } catch (Throwable t) {
            return t;
        }
        return none("call");
    }

    /** generate with a cancel supplier answering {@code true} from its {@code cancelAfter + 1}-th poll on. */
    public static Throwable generateCancelled(PythonLanguageModel lm, int[] prompt, int cancelAfter) {
        int[] polls = {0};
        int[] generated = {0};
        GenerationListener counter = new GenerationListener() {
            @Override public void onGeneratedTokens(int n) { generated[0] += n; }
        };
        try {
            ChatCompletion c = lm.generate(prompt, 16, 0.0, 1.0, false, 0L, counter,
                    () -> polls[0]++ >= cancelAfter);
            return none("generate (" + c.completionTokens().length + " tokens)");
        } catch (CancellationException e) {
            Check.eq(cancelAfter + 1, polls[0], "cancel polls");
            Check.check(generated[0] < 16, "generation stopped early: " + generated[0] + " tokens");
            Check.eq(0, lm.kvCachePool().boundRequestCount(), "the request's KV was released");
            lm.kvCachePool().checkInvariants();
            return e;
        } catch (Throwable t) {
            return t;
        }
    }

    public static Throwable generate(LanguageModel lm, int[] prompt, int maxGenLen, double temperature, double topp) {
        try {
            lm.generate(prompt, maxGenLen, temperature, topp, false, 0L, null);
        } catch (Throwable t) {
            return t;
        }
        return none("generate");
    }

    /** A Java listener's own exception, thrown from {@code event}, must come back from generate unchanged. */
    public static String listenerThrows(PythonLanguageModel lm, int[] prompt, String event) {
        RuntimeException boom = new ListenerBoom("boom in " + event);
        int[] calls = {0};
        GenerationListener listener = new GenerationListener() {
            @Override public void onInputTokens(int n) { maybe("onInputTokens"); }
            @Override public void onGeneratedTokens(int n) { maybe("onGeneratedTokens"); }
            @Override public void onText(String chunk) { maybe("onText"); }

            void maybe(String e) {
                if (e.equals(event)) {
                    calls[0]++;
                    throw boom;
                }
            }
        };
        try {
            lm.generate(prompt, 8, 0.0, 1.0, false, 0L, listener);
            throw new AssertionError("generate returned although " + event + " threw");
        } catch (ListenerBoom e) {
            if (e != boom) throw new AssertionError("a different ListenerBoom came back: " + e, e);
            Check.eq(1, calls[0], "the listener threw once");
            Check.eq(0, lm.kvCachePool().boundRequestCount(), "pool clean after the listener threw");
            lm.kvCachePool().checkInvariants();
            StackTraceElement top = e.getStackTrace()[0];
            return e.getMessage() + " at " + top.getClassName() + "." + top.getMethodName();
        }
    }

    /** The listener's exception type (unchecked, private to the tests). */
    public static final class ListenerBoom extends RuntimeException {
        public ListenerBoom(String message) {
            super(message);
        }
    }
}
