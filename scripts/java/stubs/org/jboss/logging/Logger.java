package org.jboss.logging;

/** Stub of JBoss Logging's Logger: the calls Smile's sources make, doing nothing. */
public class Logger {
    public static Logger getLogger(Class<?> type) { return new Logger(); }

    public void debugf(String format, Object... args) {}
    public void infof(String format, Object... args) {}
    public void warnf(String format, Object... args) {}
    public void warnf(Throwable t, String format, Object... args) {}
    public void errorf(String format, Object... args) {}
    public void errorf(Throwable t, String format, Object... args) {}
}
