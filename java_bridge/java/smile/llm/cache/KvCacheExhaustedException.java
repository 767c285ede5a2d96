package smile.llm.cache;

/** The KV pool has too few free or evictable pages for a request; nothing changed, so the caller may retry later. */
public class KvCacheExhaustedException extends IllegalStateException {
    public KvCacheExhaustedException(String message) {
        super(message);
    }
}
