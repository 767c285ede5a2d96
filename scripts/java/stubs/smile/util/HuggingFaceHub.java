package smile.util;

import java.io.IOException;
import java.nio.file.Path;

/** Stub (out of the bridge's scope). */
public final class HuggingFaceHub {
    private HuggingFaceHub() {}

    public static Path download(String repoId, String file) throws IOException {
        throw new UnsupportedOperationException();
    }
}
