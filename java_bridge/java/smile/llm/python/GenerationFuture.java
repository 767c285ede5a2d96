package smile.llm.python;

import java.util.concurrent.CompletableFuture;
import smile.llm.Completion;

/**
 * The future of one asynchronous generation. {@link #cancel(boolean)} cancels the request itself: a queued request
 * leaves the queue, a running one is evicted, and its KV pages are free when {@code cancel} returns; the future then
 * completes with a {@link java.util.concurrent.CancellationException}. Completion and every listener callback of
 * the request run on a delivery thread, never on the thread that serves the model. Created by the bridge.
 */
public final class GenerationFuture extends CompletableFuture<Completion> {
    private volatile Runnable canceller;
    private volatile long requestId;

    GenerationFuture() {}

    /** Binds the future to its submitted request (called once, by the bridge, before the future is returned). */
    void attach(long requestId, Runnable canceller) {
        this.requestId = requestId;
        this.canceller = canceller;
    }

    /** The request's submission number on its model (from 1). */
    public long requestId() {
        return requestId;
    }

    /** Cancels the request (its pages are free on return) and this future; false if it had already completed. */
    @Override
    public boolean cancel(boolean mayInterruptIfRunning) {
        if (isDone()) return false;
        cancelRequest();
        return super.cancel(mayInterruptIfRunning);
    }

    /** Cancels the request in the model without completing this future (pages free on return). */
    void cancelRequest() {
        Runnable c = canceller;
        if (c != null) c.run();
    }
}
