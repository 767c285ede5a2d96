package smile.chat;

import java.util.Optional;

/** Stub of the serve module's KV-cache configuration mapping (out of the bridge's scope). */
public interface KvCacheConfig {
    Optional<String> dtype();
    int pageSize();
    boolean prefixReuse();
}
