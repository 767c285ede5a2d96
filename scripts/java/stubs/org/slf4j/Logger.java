package org.slf4j;

/** Stub of slf4j's Logger: the calls Smile's sources make, doing nothing. */
public interface Logger {
    default void trace(String format, Object... args) {}
    default void debug(String format, Object... args) {}
    default void info(String format, Object... args) {}
    default void warn(String format, Object... args) {}
    default void error(String format, Object... args) {}
    default boolean isDebugEnabled() { return false; }
    default boolean isTraceEnabled() { return false; }
}
