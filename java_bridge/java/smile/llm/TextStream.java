package smile.llm;

import java.util.Objects;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The text of one request as a blocking, sequential {@link Stream} of chunks (see
 * {@link smile.llm.python.PythonLanguageModel#streamText}). The request is queued when the stream is opened (bad
 * input throws there); each element is the next chunk of text (never empty), waiting for it when it has not arrived
 * yet. The stream ends when the request finishes; if the request fails, the operation that reaches its end throws
 * the request's exception ({@link CancellationException} when it was cancelled). {@link Stream#close()} cancels the
 * request: its KV pages are free when {@code close} returns. Use it in try-with-resources so an early exit (a
 * short-circuiting operation such as {@code limit} or {@code findFirst}, an exception) cancels the rest of the
 * generation.
 */
public final class TextStream {
    private static final Object END = new Object();

    private TextStream() {}

    /**
     * A stream of the text of the request that {@code submit} queues at once with the listener it is given;
     * {@code submit} returns the request's future, whose {@code cancel} releases the request.
     */
    public static Stream<String> open(Function<GenerationListener, CompletableFuture<Completion>> submit) {
        Objects.requireNonNull(submit, "submit");
        BlockingQueue<Object> chunks = new LinkedBlockingQueue<>();
        GenerationListener listener = new GenerationListener() {
            @Override
            public void onText(String chunk) {
                chunks.add(chunk);
            }
        };
        CompletableFuture<Completion> future = submit.apply(listener);
        future.whenComplete((completion, error) -> chunks.add(END));  // after the request's last onText
        Spliterator<String> source = new Spliterators.AbstractSpliterator<>(Long.MAX_VALUE,
                Spliterator.ORDERED | Spliterator.NONNULL) {
            private boolean ended;

            @Override
            public boolean tryAdvance(Consumer<? super String> action) {
                if (ended) return false;
                Object item;
                try {
                    item = chunks.take();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    future.cancel(true);
                    throw new CancellationException("interrupted while waiting for text; the request was cancelled");
                }
                if (item == END) {
                    ended = true;
                    rethrowFailure(future);
                    return false;
                }
                action.accept((String) item);
                return true;
            }
        };
        return StreamSupport.stream(source, false).onClose(() -> future.cancel(true));
    }

    /** Throws the request's exception if it failed or was cancelled (unwrapped from the future's wrapper). */
    private static void rethrowFailure(CompletableFuture<Completion> future) {
        try {
            future.join();
        } catch (CompletionException e) {
            Throwable cause = e.getCause();
            if (cause instanceof RuntimeException) throw (RuntimeException) cause;
            if (cause instanceof Error) throw (Error) cause;
            throw e;
        }
    }
}
