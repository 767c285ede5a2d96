import java.io.PrintWriter;
import java.util.ArrayList;
import java.util.List;
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
 * line {@code RESULT <class> passed=N failed=N skipped=N}. Used by {@code scripts/smile_java_tests.py}
 * to run Smile's own tests against the bridge jar.
 */
public final class RunJUnit {
    private RunJUnit() {}

    public static void main(String[] args) {
        Launcher launcher = LauncherFactory.create();
        PrintWriter out = new PrintWriter(System.out, true);
        for (String name : args) {
            LauncherDiscoveryRequest request = LauncherDiscoveryRequestBuilder.request()
                    .selectors(DiscoverySelectors.selectClass(name)).build();
            int[] counts = new int[3];
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
                        lines.add("FAIL " + name + "." + id.getDisplayName() + " -- " + why);
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
                    + " skipped=" + counts[2]);
        }
    }
}
