package bridgetest;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.List;

/** Runs the {@link Scenario} methods of a class by name: each returns its log, or throws (AssertionError, ...). */
public final class Scenarios {
    private Scenarios() {}

    /** The scenario names of {@code className}, sorted. */
    public static String[] names(String className) throws ClassNotFoundException {
        List<String> out = new ArrayList<>();
        for (Method m : Class.forName(className).getDeclaredMethods()) {
            if (m.isAnnotationPresent(Scenario.class)) out.add(m.getName());
        }
        out.sort(null);
        return out.toArray(new String[0]);
    }

    /** Runs one scenario; its log lines come back, its exception is rethrown unchanged. */
    public static String[] run(String className, String name) throws Throwable {
        Method m = Class.forName(className).getDeclaredMethod(name, List.class);
        if (!m.isAnnotationPresent(Scenario.class) || !Modifier.isStatic(m.getModifiers())) {
            throw new IllegalArgumentException(className + "." + name + " is not a static @Scenario method");
        }
        List<String> log = new ArrayList<>();
        try {
            m.invoke(null, log);
        } catch (InvocationTargetException e) {
            throw e.getCause();
        }
        return log.toArray(new String[0]);
    }
}
