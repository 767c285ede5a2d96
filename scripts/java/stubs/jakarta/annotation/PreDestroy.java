package jakarta.annotation;

/** Stub (out of the bridge's scope). */
public @interface PreDestroy {
}
