import java.io.PrintWriter;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Set;
import org.junit.platform.engine.TestExecutionResult;
import org.junit.platform.engine.discovery.DiscoverySelectors;
import org.junit.platform.launcher.Launcher;
import org.junit.platform.launcher.LauncherDiscoveryRequest;
import org.junit.platform.launcher.TestExecutionListener;
import org.junit.platform.launcher.TestIdentifier;
import org.junit.platform.launcher.core.LauncherDiscoveryRequestBuilder;
import org.junit.platform.launcher.core.LauncherFactory;

/**
 * Runs the JUnit 5 test classes named on the command line and prints one line per test
 * ({@code PASS}, {@code FAIL} with the first line of the failure, {@code SKIP}) and a summary
 * line {@code RESULT <class> passed=N failed=N skipped=N libtorch=N}. Used by
 * {@code scripts/smile_java_tests.py} to run Smile's own tests against the bridge jar.
 *
 * <p>A failure whose exception, or one of its causes, is the {@code UnsupportedOperationException("LibTorch")}
 * of a device stub (the project's shadow classes) ends its {@code FAIL} line with
 * {@code [LibTorch at <class>.<method>]}, where the stub threw it, and counts in {@code libtorch} as well as in
 * {@code failed}.
 */
public final class RunJUnit {
    private RunJUnit() {}

    public static void main(String[] args) {
        Launcher launcher = LauncherFactory.create();
        PrintWriter out = new PrintWriter(System.out, true);
        for (String name : args) {
            LauncherDiscoveryRequest request = LauncherDiscoveryRequestBuilder.request()
                    .selectors(DiscoverySelectors.selectClass(name)).build();
            int[] counts = new int[4];
            List<String> lines = new ArrayList<>();
            launcher.execute(request, new TestExecutionListener() {
                @Override
                public void executionFinished(TestIdentifier id, TestExecutionResult result) {
                    if (!id.isTest()) return;
                    if (result.getStatus() == TestExecutionResult.Status.SUCCESSFUL) {
                        counts[0]++;
                        lines.add("PASS " + name + "." + id.getDisplayName());
                    } else {
                        counts[1]++;
                        String why = result.getThrowable().map(t -> t.getClass().getSimpleName() + ": "
                                + String.valueOf(t.getMessage()).split("\n")[0]).orElse("?");
                        String stub = result.getThrowable().map(RunJUnit::libTorchStub).orElse(null);
                        if (stub != null) counts[3]++;
                        lines.add("FAIL " + name + "." + id.getDisplayName() + " -- " + why
                                + (stub == null ? "" : " [LibTorch at " + stub + "]"));
                    }
                }

                @Override
                public void executionSkipped(TestIdentifier id, String reason) {
                    if (id.isTest()) {
                        counts[2]++;
                        lines.add("SKIP " + name + "." + id.getDisplayName() + " -- " + reason);
                    }
                }
            });
            lines.forEach(out::println);
            out.println("RESULT " + name + " passed=" + counts[0] + " failed=" + counts[1]
                    + " skipped=" + counts[2] + " libtorch=" + counts[3]);
        }
    }

    /**
     * Where a device stub threw {@code UnsupportedOperationException("LibTorch")} ({@code Class.method}, its top
     * frame), if {@code failure} or one of its causes is that exception; null otherwise.
     */
    static String libTorchStub(Throwable failure) {
        Set<Throwable> seen = Collections.newSetFromMap(new IdentityHashMap<>());
        for (Throwable t = failure; t != null && seen.add(t); t = t.getCause()) {
            if (t instanceof UnsupportedOperationException && "LibTorch".equals(t.getMessage())) {
                StackTraceElement[] stack = t.getStackTrace();
                return stack.length == 0 ? "?" : stack[0].getClassName() + "." + stack[0].getMethodName();
            }
        }
        return null;
    }
}
