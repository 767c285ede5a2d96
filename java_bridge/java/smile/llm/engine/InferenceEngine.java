package smile.llm.engine;

import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import smile.llm.LanguageModel;
import smile.llm.cache.KvCachePool;
import smile.llm.python.PythonModelExecutor;

/**
 * Continuous batching over one {@link ModelExecutor}, with Smile's constructors and members: {@link #submit} queues a
 * request from any thread and returns its {@link GenerationHandle} at once; requests are admitted first come, first
 * served, at most {@link #maxInFlight()} at a time, while the KV pool has room.
 *
 * <p><b>The bridged Python model</b> ({@code new InferenceEngine(lm.executor(), ...)}, or
 * {@link smile.llm.python.PythonLanguageModel#engine(int, int)}): every request goes to the model's one Python
 * serving loop ({@code smile_llm.InferenceEngine}: continuous batching, preemption, prefix cache, speculative
 * decoding), the same loop that serves the model's {@code generate}, {@code chat} and {@code submit} calls from any
 * thread, so engine requests batch with them. A dialog is rendered by the model's chat template. Only one engine may
 * be attached to a model at a time.
 *
 * <p><b>A Java executor</b> (a model whose forward pass is written in Java): the engine runs its own loop on one
 * daemon thread, because only Java can call that forward. Each tick it admits queued requests
 * ({@link ModelExecutor#bind}; a request that does not fit waits), prefills at most {@link #prefillTokenBudget()}
 * prompt tokens in chunks ({@link ModelExecutor#prefillChunk}), then decodes up to {@link #maxDecodeBatch()} rows
 * in one {@link ModelExecutor#decodeStep} (rows taken in turn when more are decoding). A token is the argmax of its
 * logits at temperature 0, else drawn from the top-p nucleus of the tempered softmax with the request's own seeded
 * generator. A stop token ({@link ModelExecutor#stopTokens()}, never part of the completion), {@code maxGenLen} or
 * the model's length ends a request ({@link ModelExecutor#finish}); an abort or an error evicts it
 * ({@link ModelExecutor#evict}). Listener callbacks run on the engine's thread, in order: input and cached-input
 * counts at admission, then one generated-token count and any new text per token; a listener that throws fails its
 * own request only. When {@link ModelExecutor#supportsStepApi()} is false requests run one at a time through
 * {@link LanguageModel#generate}.
 *
 * <p>On both paths a request not admitted within the admission timeout fails with {@link IllegalStateException}, and
 * {@link #close()} fails every unfinished request with {@link IllegalStateException}. Every method is safe from any
 * thread.
 */
public final class InferenceEngine implements AutoCloseable {
    /** Prompt tokens prefilled per tick unless given. */
    public static final int DEFAULT_PREFILL_TOKEN_BUDGET = 2048;
    /** How long a request may wait for admission unless given: two minutes. */
    /** How long an idle engine waits for more requests after the first (Java executors; 5-argument form). */
    public static final long DEFAULT_ADMIT_COALESCE_MS = 5;

    public static final long DEFAULT_ADMISSION_TIMEOUT_MS = 120_000L;

    private final ModelExecutor executor;
    private final int maxInFlight;
    private final int maxDecodeBatch;
    private final int prefillTokenBudget;
    private final long admissionTimeoutMs;
    private final long admitCoalesceMs;
    private final AtomicLong nextId = new AtomicLong(1);
    private final Counters counters = new Counters();
    private final Runner runner;
    private volatile int maxSpeculativeConcurrency = -1;

    /** {@code InferenceEngine(executor, maxInFlight, maxInFlight, DEFAULT_PREFILL_TOKEN_BUDGET,
     * DEFAULT_ADMISSION_TIMEOUT_MS)}. */
    public InferenceEngine(ModelExecutor executor, int maxInFlight) {
        this(executor, maxInFlight, maxInFlight, DEFAULT_PREFILL_TOKEN_BUDGET, DEFAULT_ADMISSION_TIMEOUT_MS);
    }

    /**
     * The engine with {@link #DEFAULT_ADMIT_COALESCE_MS}: an idle engine waits that long after a request arrives, so
     * requests submitted together are admitted (and bound) together.
     */
    public InferenceEngine(ModelExecutor executor, int maxInFlight, int maxDecodeBatch, int prefillTokenBudget,
                           long admissionTimeoutMs) {
        this(executor, maxInFlight, maxDecodeBatch, prefillTokenBudget, admissionTimeoutMs,
                DEFAULT_ADMIT_COALESCE_MS);
    }

    /**
     * Starts an engine.
     *
     * @param executor the model.
     * @param maxInFlight the most requests admitted at once ({@code >= 1}).
     * @param maxDecodeBatch the most rows of one decode step ({@code >= 1}; at most {@code maxInFlight}).
     * @param prefillTokenBudget the most prompt tokens prefilled per tick ({@code >= 1}).
     * @param admissionTimeoutMs how long a request may wait to be admitted before it fails; {@code <= 0}: forever.
     * @param admitCoalesceMs (Java executors) how long an idle engine waits for more requests after the first one
     *     arrives, so a burst is admitted together; {@code <= 0}: no wait.
     * @throws NullPointerException for a null executor.
     * @throws IllegalArgumentException for a value below 1.
     * @throws IllegalStateException when the bridged model already has an engine attached.
     */
    public InferenceEngine(ModelExecutor executor, int maxInFlight, int maxDecodeBatch, int prefillTokenBudget,
                           long admissionTimeoutMs, long admitCoalesceMs) {
        this.executor = Objects.requireNonNull(executor, "executor");
        if (maxInFlight < 1) throw new IllegalArgumentException("maxInFlight must be >= 1, got " + maxInFlight);
        if (maxDecodeBatch < 1) {
            throw new IllegalArgumentException("maxDecodeBatch must be >= 1, got " + maxDecodeBatch);
        }
        if (prefillTokenBudget < 1) {
            throw new IllegalArgumentException("prefillTokenBudget must be >= 1, got " + prefillTokenBudget);
        }
        this.maxInFlight = maxInFlight;
        this.maxDecodeBatch = Math.min(maxDecodeBatch, maxInFlight);
        this.prefillTokenBudget = prefillTokenBudget;
        this.admissionTimeoutMs = admissionTimeoutMs;
        this.admitCoalesceMs = Math.max(0, admitCoalesceMs);
        if (executor instanceof PythonModelExecutor python) {
            this.runner = new PythonRunner(python, maxInFlight, prefillTokenBudget, admissionTimeoutMs, counters);
        } else {
            this.runner = new StepLoop(executor, this.maxInFlight, this.maxDecodeBatch, prefillTokenBudget,
                    admissionTimeoutMs, this.admitCoalesceMs, counters);
        }
    }

    /**
     * Limits speculative decoding to steps of at most {@code n} rows (a larger step decodes plainly); 0 turns it
     * off, a negative value removes the limit. On the bridged model it sets the model's
     * {@code speculative_max_batch} while the engine is open (the previous value returns at {@link #close()}); the
     * engine's own loop for Java executors does not speculate, and only records it.
     */
    public void setMaxSpeculativeConcurrency(int n) {
        maxSpeculativeConcurrency = n;
        runner.setMaxSpeculativeConcurrency(n);
    }

    /** The last value given to {@link #setMaxSpeculativeConcurrency}, -1 (no limit) before any. */
    public int maxSpeculativeConcurrency() {
        return maxSpeculativeConcurrency;
    }

    /** The model served ({@link ModelExecutor#model()}). */
    public LanguageModel model() {
        return executor.model();
    }

    /** The most requests admitted at once. */
    public int maxInFlight() {
        return maxInFlight;
    }

    /** The most rows of one decode step. */
    public int maxDecodeBatch() {
        return maxDecodeBatch;
    }

    /** The most prompt tokens prefilled per tick. */
    public int prefillTokenBudget() {
        return prefillTokenBudget;
    }

    /** How long a request may wait to be admitted; {@code <= 0}: forever. */
    public long admissionTimeoutMs() {
        return admissionTimeoutMs;
    }

    /** Requests waiting for admission (on the bridged model: from every caller of the model). */
    public int queueSize() {
        return runner.queueSize();
    }

    /** Requests admitted and unfinished (on the bridged model: from every caller of the model). */
    public int inFlight() {
        return runner.inFlight();
    }

    /** Admitted requests past their prefill, generating. */
    public int activeDecodeCount() {
        return runner.activeDecodeCount();
    }

    /** Free KV slots of the executor's pool; -1 without a pool. */
    public int kvFreeSlots() {
        KvCachePool pool = executor.kvCachePool();
        return pool == null ? -1 : pool.freeSlots();
    }

    /** Free KV pages of the executor's pool; -1 without a pool. */
    public int kvFreePages() {
        KvCachePool pool = executor.kvCachePool();
        return pool == null ? -1 : pool.freePages();
    }

    /** Milliseconds admitted requests waited in the queue, summed over requests. */
    public long queueWaitMsTotal() {
        return counters.queueWaitNs.get() / 1_000_000L;
    }

    /**
     * Milliseconds spent prefilling: on a Java executor the time in its prefill calls; on the bridged model each
     * request's time from admission to its first token, summed over requests.
     */
    public long prefillMsTotal() {
        return counters.prefillNs.get() / 1_000_000L;
    }

    /**
     * Milliseconds spent decoding: on a Java executor the time in its decode steps; on the bridged model each
     * request's time from its first token to its end, summed over requests.
     */
    public long decodeMsTotal() {
        return counters.decodeNs.get() / 1_000_000L;
    }

    /** Requests that completed normally. */
    public long completedCount() {
        return counters.completed.get();
    }

    /** {@code submit(request, handle -> {})}. */
    public GenerationHandle submit(GenerationRequest request) {
        return submit(request, h -> {});
    }

    /**
     * Queues {@code request} and returns its handle at once. {@code onCreated} receives the handle before the
     * request can start (so a listener may look its id up); it must not block.
     *
     * @throws IllegalArgumentException for a null request, a request with neither tokens nor dialog, or a bad value
     *     (named; nothing queued).
     * @throws IllegalStateException after {@link #close()}.
     */
    public GenerationHandle submit(GenerationRequest request, Consumer<GenerationHandle> onCreated) {
        if (request == null) throw new IllegalArgumentException("request must not be null");
        Objects.requireNonNull(onCreated, "onCreated");
        if (runner.closed()) throw new IllegalStateException("InferenceEngine is closed (shut down)");
        int[] prompt = request.promptTokens();
        if (prompt == null) {
            if (request.dialog() == null) {
                throw new IllegalArgumentException("request has neither promptTokens nor dialog");
            }
            prompt = executor.model().encodeChat(request.dialog());
        }
        GenerationHandle handle = new GenerationHandle(nextId.getAndIncrement(), new CompletableFuture<>());
        runner.check(prompt, request);
        onCreated.accept(handle);
        runner.submit(handle, prompt.clone(), request);
        return handle;
    }

    /**
     * Stops the engine: waiting and running requests fail with {@link IllegalStateException} (their KV released),
     * later submits are refused, and on the bridged model the Python engine detaches (the model keeps serving its
     * other callers). Waits at most a few seconds for the engine's thread. Idempotent.
     */
    @Override
    public void close() {
        runner.close();
    }

    /** The cumulative counters, shared with the runner. */
    static final class Counters {
        final AtomicLong queueWaitNs = new AtomicLong();
        final AtomicLong prefillNs = new AtomicLong();
        final AtomicLong decodeNs = new AtomicLong();
        final AtomicLong completed = new AtomicLong();

        /** Completes {@code future} with {@code c}, counted first so a caller woken by it sees the count. */
        void complete(java.util.concurrent.CompletableFuture<smile.llm.ChatCompletion> future,
                      smile.llm.ChatCompletion c) {
            completed.incrementAndGet();
            if (!future.complete(c)) completed.decrementAndGet();
        }
    }

    /** The engine's two implementations: the bridged model's Python loop, or the Java step loop. */
    interface Runner {
        /** Refuses a bad request with {@link IllegalArgumentException} before anything is queued. */
        void check(int[] prompt, GenerationRequest request);

        void submit(GenerationHandle handle, int[] prompt, GenerationRequest request);

        boolean closed();

        int queueSize();

        int inFlight();

        int activeDecodeCount();

        void setMaxSpeculativeConcurrency(int n);

        void close();
    }

    /** Admission deadlines of every engine: one daemon thread. */
    static final java.util.concurrent.ScheduledThreadPoolExecutor TIMER = timer();

    private static java.util.concurrent.ScheduledThreadPoolExecutor timer() {
        var t = new java.util.concurrent.ScheduledThreadPoolExecutor(1, r -> {
            Thread thread = new Thread(r, "smile-inference-engine-timer");
            thread.setDaemon(true);
            return thread;
        });
        t.setRemoveOnCancelPolicy(true);
        return t;
    }

    /** The exception of a request not admitted in time. */
    static IllegalStateException admissionTimeout(long requestId, long waitedMs) {
        return new IllegalStateException("admission timeout: request " + requestId + " was not admitted within "
                + waitedMs + " ms");
    }

    /** The exception of a request ended by {@link #close()}. */
    static IllegalStateException closedError() {
        return new IllegalStateException("InferenceEngine closed before the request finished");
    }
}
