package bridgetest;

import java.lang.reflect.Field;
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
 *
 * <p>{@code KvCachePool} is a class over a {@link KvCachePool.Backend}, as in Smile; the audited pool is a new
 * {@code KvCachePool} over a proxy of the given pool's backend (read by reflection: the class exposes none), so
 * every backend call the class makes is audited.
 */
public final class Audited {
    /** Operations checked so far, by every audited pool. */
    public static final AtomicLong CHECKS = new AtomicLong();

    private Audited() {}

    public static KvCachePool wrap(KvCachePool pool) {
        KvCachePool.Backend inner = backendOf(pool);
        KvCachePool.Backend audited = (KvCachePool.Backend) Proxy.newProxyInstance(
                KvCachePool.Backend.class.getClassLoader(), new Class<?>[] {KvCachePool.Backend.class},
                (proxy, method, args) -> {
                    String name = method.getName();
                    if (method.getDeclaringClass() == Object.class) {
                        return name.equals("equals") ? proxy == args[0]
                                : name.equals("hashCode") ? System.identityHashCode(proxy)
                                : "Audited(" + inner + ")";
                    }
                    Throwable failure = null;
                    try {
                        return method.invoke(inner, args);
                    } catch (InvocationTargetException e) {
                        failure = e.getCause();
                        throw failure;
                    } finally {
                        if (!name.equals("close") && !name.equals("checkInvariants")) {
                            try {
                                inner.checkInvariants();
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
        return new KvCachePool(audited);
    }

    /** The backend a pool delegates to. */
    static KvCachePool.Backend backendOf(KvCachePool pool) {
        try {
            Field f = KvCachePool.class.getDeclaredField("backend");
            f.setAccessible(true);
            return (KvCachePool.Backend) f.get(pool);
        } catch (ReflectiveOperationException e) {
            throw new AssertionError("KvCachePool has no backend field", e);
        }
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
