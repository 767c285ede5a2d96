package bridgetest;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.util.concurrent.atomic.AtomicLong;
import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;

/**
 * A {@link KvCachePool} that calls {@code checkInvariants()} on the Python pool after every operation, including
 * the ones that throw (a failed call must leave the pool consistent). A broken invariant is an AssertionError
 * naming the operation, with the operation's own exception (if any) suppressed into it.
 */
public final class Audited {
    /** Operations checked so far, by every audited pool. */
    public static final AtomicLong CHECKS = new AtomicLong();

    private Audited() {}

    public static KvCachePool wrap(KvCachePool pool) {
        return (KvCachePool) Proxy.newProxyInstance(KvCachePool.class.getClassLoader(),
                new Class<?>[] {KvCachePool.class}, (proxy, method, args) -> {
                    String name = method.getName();
                    if (method.getDeclaringClass() == Object.class) {
                        return name.equals("equals") ? proxy == args[0]
                                : name.equals("hashCode") ? System.identityHashCode(proxy)
                                : "Audited(" + pool + ")";
                    }
                    Throwable failure = null;
                    try {
                        return method.invoke(pool, args);
                    } catch (InvocationTargetException e) {
                        failure = e.getCause();
                        throw failure;
                    } finally {
                        if (!name.equals("close") && !name.equals("checkInvariants")) {
                            try {
                                pool.checkInvariants();
                                CHECKS.incrementAndGet();
                            } catch (RuntimeException broken) {
                                AssertionError e = new AssertionError("invariants broken after " + name + ": "
                                        + broken.getMessage(), broken);
                                if (failure != null) e.addSuppressed(failure);
                                throw e;
                            }
                        }
                    }
                });
    }

    /** {@code Bridge.forTesting(layout)}, audited. */
    public static KvCachePool forTesting(int layers, int kvHeads, int headDim, int maxBatch, int maxSeq) {
        return wrap(Bridge.forTesting(new KvCacheLayout(layers, kvHeads, headDim, maxBatch, maxSeq)));
    }

    /** {@code Bridge.newKvCachePool(...)} (float32), audited. */
    public static KvCachePool pool(int layers, int slots, int kvHeads, int headDim, int pageSize) {
        return wrap(Bridge.newKvCachePool(layers, slots, kvHeads, headDim, pageSize, "float32"));
    }
}
