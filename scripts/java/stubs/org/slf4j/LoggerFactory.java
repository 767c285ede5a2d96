package org.slf4j;

/** Stub of slf4j's LoggerFactory. */
public final class LoggerFactory {
    private LoggerFactory() {}

    public static Logger getLogger(Class<?> type) {
        return new Logger() {};
    }
}
