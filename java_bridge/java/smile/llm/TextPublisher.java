package smile.llm;

import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Flow;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;

/**
 * The text of one request as a {@link Flow.Publisher} (see {@link smile.llm.python.PythonLanguageModel#stream}): a
 * cold, single-subscriber publisher that submits its request when subscribed. Chunks are buffered until demanded (a
 * request's text is bounded by its {@code maxGenLen}), signals are serialised (never two at once), and nothing is
 * signalled after cancellation or a terminal signal. {@code request(n <= 0)} cancels the request and signals
 * {@link IllegalArgumentException} (Reactive Streams rule 3.9).
 */
public final class TextPublisher implements Flow.Publisher<String> {
    private final Function<GenerationListener, CompletableFuture<Completion>> submit;
    private final AtomicBoolean subscribed = new AtomicBoolean();

    private TextPublisher(Function<GenerationListener, CompletableFuture<Completion>> submit) {
        this.submit = Objects.requireNonNull(submit, "submit");
    }

    /**
     * A publisher of the text of the request that {@code submit} queues (with the listener it is given) when the
     * subscriber arrives; {@code submit} returns the request's future.
     */
    public static TextPublisher of(Function<GenerationListener, CompletableFuture<Completion>> submit) {
        return new TextPublisher(submit);
    }

    @Override
    public void subscribe(Flow.Subscriber<? super String> subscriber) {
        Objects.requireNonNull(subscriber, "subscriber");
        if (!subscribed.compareAndSet(false, true)) {
            subscriber.onSubscribe(new Flow.Subscription() {
                @Override public void request(long n) {}
                @Override public void cancel() {}
            });
            subscriber.onError(new IllegalStateException("this publisher streams one request to one subscriber; "
                    + "call stream(...) again for another"));
            return;
        }
        new Streaming(subscriber).start();
    }

    /** The subscription of the one subscriber: a drain loop guarded by a work-in-progress counter. */
    private final class Streaming implements Flow.Subscription, GenerationListener {
        private final Flow.Subscriber<? super String> downstream;
        private final ConcurrentLinkedQueue<String> chunks = new ConcurrentLinkedQueue<>();
        private final AtomicLong demand = new AtomicLong();
        private final AtomicInteger wip = new AtomicInteger();
        private volatile CompletableFuture<Completion> future;
        private volatile boolean cancelled;
        private volatile boolean finished;  // the request ended; every chunk is in `chunks`
        private volatile Throwable error;  // the request's error, when finished
        private volatile Throwable protocolError;  // request(n <= 0): signalled at once
        private boolean terminated;  // touched only inside drain

        Streaming(Flow.Subscriber<? super String> downstream) {
            this.downstream = downstream;
        }

        void start() {
            downstream.onSubscribe(this);
            if (cancelled || protocolError != null) return;
            CompletableFuture<Completion> f;
            try {
                f = submit.apply(this);
            } catch (Throwable t) {  // refused before anything was queued
                error = t;
                finished = true;
                drain();
                return;
            }
            future = f;
            if (cancelled || protocolError != null) {
                f.cancel(true);
                return;
            }
            f.whenComplete((completion, t) -> {
                error = t instanceof CompletionException && t.getCause() != null ? t.getCause() : t;
                finished = true;
                drain();
            });
        }

        @Override
        public void onText(String chunk) {
            chunks.add(chunk);
            drain();
        }

        @Override
        public void request(long n) {
            if (n <= 0) {
                protocolError = new IllegalArgumentException("Flow.Subscription.request(n) needs n > 0, got " + n);
                cancelRequest();
            } else {
                demand.getAndAccumulate(n, (a, b) -> a + b < 0 ? Long.MAX_VALUE : a + b);
            }
            drain();
        }

        @Override
        public void cancel() {
            cancelled = true;
            cancelRequest();
        }

        private void cancelRequest() {
            CompletableFuture<Completion> f = future;
            if (f != null) f.cancel(true);  // the request's pages are free on return
        }

        private void drain() {
            if (wip.getAndIncrement() != 0) return;
            int missed = 1;
            do {
                if (!terminated && !cancelled) {
                    Throwable bad = protocolError;
                    if (bad != null) {
                        terminated = true;
                        chunks.clear();
                        downstream.onError(bad);
                    } else {
                        long wanted = demand.get();
                        long emitted = 0;
                        while (emitted < wanted && !cancelled) {
                            String chunk = chunks.poll();
                            if (chunk == null) break;
                            downstream.onNext(chunk);
                            emitted++;
                        }
                        if (emitted > 0 && wanted != Long.MAX_VALUE) demand.addAndGet(-emitted);
                        if (!cancelled && finished && chunks.isEmpty()) {
                            terminated = true;
                            Throwable t = error;
                            if (t == null) downstream.onComplete();
                            else downstream.onError(t);
                        }
                    }
                }
                missed = wip.addAndGet(-missed);
            } while (missed != 0);
        }
    }
}
