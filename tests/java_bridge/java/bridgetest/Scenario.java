package bridgetest;

import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Marks a {@code public static void name(List<String> log)} scenario of a scenario class; {@link Scenarios} runs
 * it by name. pytest reads the names from the source with a regular expression (before the JVM starts), so keep
 * the annotation on its own line right above the method.
 */
@Retention(RetentionPolicy.RUNTIME)
@Target(ElementType.METHOD)
public @interface Scenario {}
