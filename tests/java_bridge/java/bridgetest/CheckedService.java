package bridgetest;

import java.io.IOException;

/** A test interface with a checked exception, implemented in Python by the tests. */
public interface CheckedService {
    String call(String what) throws IOException;
}
