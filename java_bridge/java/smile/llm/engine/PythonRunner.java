package smile.llm.engine;

import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import smile.llm.ChatCompletion;
import smile.llm.Completion;
import smile.llm.GenerationListener;
import smile.llm.python.PythonModelExecutor;
import smile.llm.python.PythonServingEngine;

/**
 * The engine over the bridged model: each request is queued on the model's Python serving loop; this class only
 * links the Python request's future to the handle's, watches admission (the first {@code onInputTokens}) for the
 * timeout, and measures the counters.
 */
final class PythonRunner implements InferenceEngine.Runner {
    private final PythonServingEngine serving;
    private final String modelName;
    private final long admissionTimeoutMs;
    private final InferenceEngine.Counters counters;
    private final Set<CompletableFuture<ChatCompletion>> open = ConcurrentHashMap.newKeySet();
    private final Object lock = new Object();
    private boolean closed;

    PythonRunner(PythonModelExecutor executor, int maxInFlight, int prefillTokenBudget, long admissionTimeoutMs,
                 InferenceEngine.Counters counters) {
        this.serving = executor.attachEngine(maxInFlight, prefillTokenBudget);
        this.modelName = executor.model().name();
        this.admissionTimeoutMs = admissionTimeoutMs;
        this.counters = counters;
    }

    @Override
    public void check(int[] prompt, GenerationRequest request) {
        // Python validates when the request is queued
    }

    @Override
    public void submit(GenerationHandle handle, int[] prompt, GenerationRequest request) {
        CompletableFuture<ChatCompletion> user = handle.future();
        Watch watch = new Watch(request.listener());
        CompletableFuture<Completion> python;
        synchronized (lock) {
            if (closed) throw new IllegalStateException("InferenceEngine is closed (shut down)");
            try {
                python = serving.submit(prompt, request, watch);
            } catch (RuntimeException e) {
                user.completeExceptionally(e);
                throw e;
            }
            open.add(user);
        }
        ScheduledFuture<?> deadline = admissionTimeoutMs <= 0 ? null : InferenceEngine.TIMER.schedule(() -> {
            if (!watch.admitted()) {
                user.completeExceptionally(InferenceEngine.admissionTimeout(handle.requestId(), admissionTimeoutMs));
            }
        }, admissionTimeoutMs, TimeUnit.MILLISECONDS);
        python.whenComplete((c, e) -> {
            if (e == null) {
                watch.record(counters);
                counters.complete(user, c.toChatCompletion(modelName));
            } else {
                user.completeExceptionally(e);
            }
        });
        // an abort, a timeout or close ends the Python request too (its pages free when cancel returns)
        user.whenComplete((c, e) -> {
            open.remove(user);
            if (deadline != null) deadline.cancel(false);
            if (!python.isDone()) python.cancel(true);
        });
    }

    @Override
    public boolean closed() {
        synchronized (lock) {
            return closed;
        }
    }

    @Override
    public int queueSize() {
        return serving.queueSize();
    }

    @Override
    public int inFlight() {
        return serving.inFlight();
    }

    @Override
    public int activeDecodeCount() {
        return serving.activeDecodeCount();
    }

    @Override
    public void setMaxSpeculativeConcurrency(int n) {
        serving.setMaxSpeculativeConcurrency(n);
    }

    @Override
    public void close() {
        synchronized (lock) {
            if (closed) return;
            closed = true;
        }
        for (CompletableFuture<ChatCompletion> f : open.toArray(new CompletableFuture[0])) {
            f.completeExceptionally(InferenceEngine.closedError());
        }
        serving.detach();
    }

    /** The caller's listener, forwarded, with the times of admission and of the first token. */
    private static final class Watch implements GenerationListener {
        private final GenerationListener listener;
        private final long submitted = System.nanoTime();
        private volatile long admittedAt;
        private volatile long firstTokenAt;

        Watch(GenerationListener listener) {
            this.listener = listener;
        }

        boolean admitted() {
            return admittedAt != 0;
        }

        void record(InferenceEngine.Counters counters) {
            long end = System.nanoTime();
            long admitted = admittedAt == 0 ? end : admittedAt;
            long first = firstTokenAt == 0 ? end : firstTokenAt;
            counters.queueWaitNs.addAndGet(Math.max(0, admitted - submitted));
            counters.prefillNs.addAndGet(Math.max(0, first - admitted));
            counters.decodeNs.addAndGet(Math.max(0, end - first));
        }

        @Override
        public void onInputTokens(int n) {
            if (admittedAt == 0) admittedAt = System.nanoTime();
            if (listener != null) listener.onInputTokens(n);
        }

        @Override
        public void onCachedInputTokens(int n) {
            if (listener != null) listener.onCachedInputTokens(n);
        }

        @Override
        public void onGeneratedTokens(int n) {
            if (firstTokenAt == 0) firstTokenAt = System.nanoTime();
            if (listener != null) listener.onGeneratedTokens(n);
        }

        @Override
        public void onThinkingTokens(int n) {
            if (listener != null) listener.onThinkingTokens(n);
        }

        @Override
        public void onText(String chunk) {
            if (listener != null) listener.onText(chunk);
        }
    }
}
