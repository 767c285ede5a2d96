package smile.llm.engine;

import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import smile.llm.ChatCompletion;

/** A submitted {@link GenerationRequest}: its id, its future and {@link #abort()}, as in Smile. */
public final class GenerationHandle {
    private final long requestId;
    private final CompletableFuture<ChatCompletion> future;
    private final AtomicBoolean aborted = new AtomicBoolean();
    private volatile Runnable onAbort;

    GenerationHandle(long requestId, CompletableFuture<ChatCompletion> future) {
        this.requestId = requestId;
        this.future = future;
    }

    /** A handle over a future made outside an engine ({@link NullPointerException} for a null future). */
    public static GenerationHandle of(long requestId, CompletableFuture<ChatCompletion> future) {
        return new GenerationHandle(requestId, Objects.requireNonNull(future, "future"));
    }

    /** The id the engine gave the request (from 1, per engine). */
    public long requestId() {
        return requestId;
    }

    /**
     * The completion; exceptionally with {@link java.util.concurrent.CancellationException} after an abort, with
     * {@link IllegalStateException} when the request was not admitted in time or the engine closed, or with the
     * error that ended the request.
     */
    public CompletableFuture<ChatCompletion> future() {
        return future;
    }

    /**
     * Cancels the request: a queued one never starts, a running one is evicted. On the bridged Python model its KV
     * pages are free when this returns. On a Java executor the engine's thread evicts it between steps and only then
     * completes the future with {@link java.util.concurrent.CancellationException}, so whoever sees the cancellation
     * sees the eviction done (the future's own {@code cancel} also ends the request, without that order).
     * Idempotent.
     */
    public void abort() {
        if (aborted.compareAndSet(false, true)) {
            Runnable hook = onAbort;
            if (hook != null) {
                hook.run();
            } else {
                future.cancel(true);
            }
        }
    }

    /** Installed by the engine that runs the request: what {@link #abort()} does instead of cancelling at once. */
    void onAbort(Runnable hook) {
        onAbort = hook;
    }

    /** Whether {@link #abort()} was called. */
    public boolean isAborted() {
        return aborted.get();
    }
}
