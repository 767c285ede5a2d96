package jakarta.inject;

/** Stub (out of the bridge's scope). */
public @interface Inject {
}
