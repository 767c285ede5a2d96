package smile.chat;

import java.util.Optional;

/** Stub of the serve module's configuration mapping (Quarkus, out of the bridge's scope). */
public interface ChatServiceConfig {
    String model();
    int maxSeqLen();
    int maxBatchSize();
    int maxDecodeBatch();
    int prefillTokenBudget();
    long admissionTimeoutMs();
    double memFractionStatic();
    String devices();
    int tensorParallelSize();
    int pipelineParallelSize();
    int modelLoaderThreads();
    String attentionBackend();
    Optional<String> flashinferAotDir();
    Optional<String> flashinferCacheDir();
    boolean flashinferDownload();
    String flashinferCudaTag();
    boolean flashinferAllowTorchFallback();
}
