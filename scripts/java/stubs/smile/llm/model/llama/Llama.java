package smile.llm.model.llama;

import java.io.IOException;
import smile.deep.tensor.ScalarType;
import smile.llm.LanguageModel;

/**
 * Stub of Smile's Llama, for the files that use it (Llama.java itself is compiled from Smile's source). Abstract:
 * it declares only what they call, not LanguageModel's methods.
 */
public abstract class Llama implements LanguageModel {
    public static ScalarType parseDtypeName(String name) { throw new UnsupportedOperationException(); }

    public static Llama build(String checkpointDir, String tokenizerPath, int maxBatchSize, int maxSeqLen,
                              byte deviceId, double memFractionStatic, String kvCacheDtype, int pageSize,
                              int modelLoaderThreads) throws IOException {
        throw new UnsupportedOperationException();
    }

    public void setPrefixReuseEnabled(boolean enabled) { throw new UnsupportedOperationException(); }
}
