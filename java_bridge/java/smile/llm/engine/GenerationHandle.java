package smile.llm.engine;

import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;
import smile.llm.Completion;

/** Handle of a queued or running {@link GenerationRequest}: its id, its future, and {@link #abort()}. */
public final class GenerationHandle {
    private final long requestId;
    private final CompletableFuture<Completion> future;
    private final AtomicBoolean aborted = new AtomicBoolean();

    private GenerationHandle(long requestId, CompletableFuture<Completion> future) {
        this.requestId = requestId;
        this.future = future;
    }

    /** A handle over {@code future} (NullPointerException for null). */
    public static GenerationHandle of(long requestId, CompletableFuture<Completion> future) {
        return new GenerationHandle(requestId, Objects.requireNonNull(future, "future"));
    }

    /** The request's submission number on its model (from 1). */
    public long requestId() {
        return requestId;
    }

    /** The completion, exceptionally with {@link java.util.concurrent.CancellationException} after an abort. */
    public CompletableFuture<Completion> future() {
        return future;
    }

    /**
     * Cancels the request: a queued one leaves the queue, a running one is evicted; its KV pages are free when this
     * returns (the future's own {@code cancel} does the same). Idempotent.
     */
    public void abort() {
        if (aborted.compareAndSet(false, true)) {
            future.cancel(true);
        }
    }

    /** Whether {@link #abort()} was called. */
    public boolean isAborted() {
        return aborted.get();
    }
}
