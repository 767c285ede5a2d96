package smile.util;

/** Stub of Smile's pair (out of the bridge's scope): what Smile's {@code KvCachePool.get(int, int)} returns. */
public record Tuple2<T1, T2>(T1 _1, T2 _2) {}
