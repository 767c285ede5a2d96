package smile.llm.python;

import java.util.concurrent.CompletableFuture;
import smile.llm.Completion;
import smile.llm.GenerationListener;
import smile.llm.engine.GenerationRequest;

/**
 * The Python engine attached for an {@link smile.llm.engine.InferenceEngine} over the bridged model (implemented in
 * Python, from {@link PythonModelExecutor#attachEngine}). Its requests join the model's one serving loop.
 */
public interface PythonServingEngine {
    /**
     * Queues {@code prompt} with the settings of {@code request} and returns at once; {@code listener} (not null) is
     * called in order on a delivery thread, its first call ({@code onInputTokens}) once the request is admitted.
     * Cancelling the future cancels the request, its KV pages free on return. {@link IllegalArgumentException} for
     * a bad value (nothing queued), {@link IllegalStateException} after {@link #detach}.
     */
    CompletableFuture<Completion> submit(int[] prompt, GenerationRequest request, GenerationListener listener);

    /** Requests queued on the model. */
    int queueSize();

    /** Requests admitted on the model. */
    int inFlight();

    /** Admitted requests that have generated at least one token. */
    int activeDecodeCount();

    /** The model's {@code speculative_max_batch}: {@code n >= 0}, or no limit for a negative {@code n}. */
    void setMaxSpeculativeConcurrency(int n);

    /** Cancels the engine's unfinished requests and detaches it; the model's earlier speculation limit returns. */
    void detach();
}
