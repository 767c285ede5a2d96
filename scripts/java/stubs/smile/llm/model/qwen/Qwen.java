package smile.llm.model.qwen;

import java.io.IOException;
import smile.llm.LanguageModel;
import smile.llm.parallel.ParallelConfig;

/**
 * Stub of Smile's Qwen, for the files that use it (Qwen.java itself is compiled from Smile's source). Abstract: it
 * declares only what they call, not LanguageModel's methods.
 */
public abstract class Qwen implements LanguageModel {
    public static Qwen build(String checkpointDir, int maxBatchSize, int maxSeqLen, byte deviceId,
                             double memFractionStatic, String kvCacheDtype, int pageSize, ParallelConfig parallel,
                             int modelLoaderThreads) throws IOException {
        throw new UnsupportedOperationException();
    }

    public void setPrefixReuseEnabled(boolean enabled) { throw new UnsupportedOperationException(); }
}
