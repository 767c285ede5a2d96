package jakarta.enterprise.context;

/** Stub (out of the bridge's scope). */
public @interface ApplicationScoped {
}
