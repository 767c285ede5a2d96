package smile.llm.python;

import java.util.ArrayDeque;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Consumer;
import smile.llm.Completion;
import smile.llm.GenerationListener;

/**
 * The Java side of one asynchronous generation: the model's serving thread reports the request's events here and
 * returns at once; they reach the caller's {@link GenerationListener} and then the {@link GenerationFuture} in order,
 * one at a time, on a delivery thread (a shared pool of daemon threads named {@code smile-llm-delivery-N}). So a slow
 * listener or a future's dependent stage never holds up the serving loop, and the future completes only after the
 * request's last listener callback has returned.
 *
 * <p>A listener that throws ends its request: the request is cancelled in the model (its pages released), later
 * events are dropped, and the future completes exceptionally with the listener's exception.
 */
public final class AsyncGeneration implements GenerationListener {
    private static final AtomicInteger THREADS = new AtomicInteger();
    private static final ExecutorService DELIVERY = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "smile-llm-delivery-" + THREADS.incrementAndGet());
        t.setDaemon(true);
        return t;
    });

    private final GenerationListener listener;
    private final GenerationFuture future = new GenerationFuture();
    private final SerialQueue events = new SerialQueue(DELIVERY);

    /** @param listener the caller's listener, or null. */
    public AsyncGeneration(GenerationListener listener) {
        this.listener = listener;
    }

    /** The future handed to the caller. */
    public GenerationFuture future() {
        return future;
    }

    /** Binds the future to the submitted request and its cancel action (called by the bridge after submission). */
    public void attach(long requestId, Runnable canceller) {
        future.attach(requestId, canceller);
    }

    // ------------------------------------------------------------------ events from the serving thread
    @Override public void onInputTokens(int n) { deliver(l -> l.onInputTokens(n)); }
    @Override public void onCachedInputTokens(int n) { deliver(l -> l.onCachedInputTokens(n)); }
    @Override public void onGeneratedTokens(int n) { deliver(l -> l.onGeneratedTokens(n)); }
    @Override public void onThinkingTokens(int n) { deliver(l -> l.onThinkingTokens(n)); }
    @Override public void onText(String chunk) { deliver(l -> l.onText(chunk)); }

    /** The request finished: completes the future after every earlier event was delivered. */
    public void complete(Completion completion) {
        events.execute(() -> future.complete(completion));
    }

    /** The request failed or was cancelled: completes the future exceptionally after the earlier events. */
    public void fail(Throwable error) {
        events.execute(() -> future.completeExceptionally(error));
    }

    private void deliver(Consumer<GenerationListener> event) {
        if (listener == null) return;
        events.execute(() -> {
            if (future.isDone()) return;  // cancelled or failed: the request's later events are dropped
            try {
                event.accept(listener);
            } catch (Throwable t) {
                future.cancelRequest();  // pages released before the caller sees the failure
                future.completeExceptionally(t);
            }
        });
    }

    /** Runs tasks one at a time, in submission order, on an executor's threads. */
    static final class SerialQueue implements Executor {
        private final Executor executor;
        private final ArrayDeque<Runnable> tasks = new ArrayDeque<>();
        private boolean draining;

        SerialQueue(Executor executor) {
            this.executor = executor;
        }

        @Override
        public void execute(Runnable task) {
            synchronized (tasks) {
                tasks.add(task);
                if (draining) return;
                draining = true;
            }
            executor.execute(this::drain);
        }

        private void drain() {
            while (true) {
                Runnable task;
                synchronized (tasks) {
                    task = tasks.poll();
                    if (task == null) {
                        draining = false;
                        return;
                    }
                }
                try {
                    task.run();
                } catch (Throwable ignored) {
                    // tasks handle their own errors; one that escapes must not stop the queue
                }
            }
        }
    }
}
