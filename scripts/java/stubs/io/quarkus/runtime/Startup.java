package io.quarkus.runtime;

/** Stub (out of the bridge's scope). */
public @interface Startup {
}
