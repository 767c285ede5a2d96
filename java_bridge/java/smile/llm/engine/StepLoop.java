package smile.llm.engine;

import java.nio.charset.CharacterCodingException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import smile.deep.tensor.Tensor;
import smile.llm.ChatCompletion;
import smile.llm.FinishReason;
import smile.llm.GenerationListener;
import smile.llm.cache.KvCacheExhaustedException;

/**
 * The engine's own loop over a {@link ModelExecutor} written in Java (see {@link InferenceEngine}). One daemon thread
 * owns the admitted requests and every executor call; other threads only queue requests, complete futures (abort,
 * close) and wake it. Every wait is bounded.
 */
final class StepLoop implements InferenceEngine.Runner {
    private static final long IDLE_WAIT_MS = 50;
    private static final long DEFERRED_WAIT_MS = 5;
    private static final long CLOSE_WAIT_MS = 5_000;

    private final ModelExecutor executor;
    private final int maxInFlight;
    private final int maxDecodeBatch;
    private final int prefillTokenBudget;
    private final long admissionTimeoutMs;
    private final long admitCoalesceMs;
    private final InferenceEngine.Counters counters;
    private final boolean stepApi;
    private final int[] stopTokens;
    private final int maxSeqLen;
    private final String modelName;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition wake = lock.newCondition();
    private final ArrayDeque<Queued> waiting = new ArrayDeque<>();  // guarded by lock
    private boolean closed;                                          // guarded by lock
    private final Set<CompletableFuture<ChatCompletion>> open = ConcurrentHashMap.newKeySet();
    private final List<Active> active = new ArrayList<>();          // the worker's only
    private volatile int inFlight;
    private volatile int decoding;
    private int turn;
    private final Thread worker;

    StepLoop(ModelExecutor executor, int maxInFlight, int maxDecodeBatch, int prefillTokenBudget,
             long admissionTimeoutMs, long admitCoalesceMs, InferenceEngine.Counters counters) {
        this.executor = executor;
        this.maxInFlight = maxInFlight;
        this.maxDecodeBatch = maxDecodeBatch;
        this.prefillTokenBudget = prefillTokenBudget;
        this.admissionTimeoutMs = admissionTimeoutMs;
        this.admitCoalesceMs = admitCoalesceMs;
        this.counters = counters;
        this.stepApi = executor.supportsStepApi();
        int[] stops = stepApi ? executor.stopTokens() : null;
        this.stopTokens = stops == null ? new int[0] : stops.clone();
        this.maxSeqLen = stepApi ? executor.maxSeqLen() : Integer.MAX_VALUE;
        this.modelName = executor.model().name();
        this.worker = new Thread(this::run, "smile-inference-engine");
        worker.setDaemon(true);
        worker.start();
    }

    // ------------------------------------------------------------------ callers' side

    @Override
    public void check(int[] prompt, GenerationRequest r) {
        if (prompt.length == 0) throw new IllegalArgumentException("promptTokens must not be empty");
        if (prompt.length > maxSeqLen) {
            throw new IllegalArgumentException("promptTokens: " + prompt.length + " tokens exceed maxSeqLen "
                    + maxSeqLen);
        }
        if (r.maxGenLen() < 0) throw new IllegalArgumentException("maxGenLen must be >= 0, got " + r.maxGenLen());
        if (!(r.temperature() >= 0) || Double.isInfinite(r.temperature())) {
            throw new IllegalArgumentException("temperature must be finite and >= 0, got " + r.temperature());
        }
        if (!(r.topp() > 0 && r.topp() <= 1)) {
            throw new IllegalArgumentException("topp must be in (0, 1], got " + r.topp());
        }
    }

    @Override
    public void submit(GenerationHandle handle, int[] prompt, GenerationRequest request) {
        CompletableFuture<ChatCompletion> future = handle.future();
        Queued q = new Queued(handle, prompt, request, System.nanoTime());
        // abort: a queued request leaves the queue and ends now; a running one ends once the worker has evicted it
        // (between steps), so a caller that sees the cancellation also sees its KV released
        handle.onAbort(() -> {
            boolean queued;
            lock.lock();
            try {
                queued = waiting.remove(q);
                wake.signalAll();
            } finally {
                lock.unlock();
            }
            if (queued) future.completeExceptionally(aborted(handle));
        });
        lock.lock();
        try {
            if (closed) throw new IllegalStateException("InferenceEngine is closed (shut down)");
            waiting.add(q);
            open.add(future);
            wake.signalAll();
        } finally {
            lock.unlock();
        }
        ScheduledFuture<?> deadline = admissionTimeoutMs <= 0 ? null : InferenceEngine.TIMER.schedule(() -> {
            if (take(q)) {
                future.completeExceptionally(InferenceEngine.admissionTimeout(handle.requestId(),
                        admissionTimeoutMs));
            }
        }, admissionTimeoutMs, TimeUnit.MILLISECONDS);
        future.whenComplete((c, e) -> {
            open.remove(future);
            if (deadline != null) deadline.cancel(false);
            lock.lock();
            try {
                waiting.remove(q);  // aborted while queued: it leaves the queue now
                wake.signalAll();   // aborted while running: the worker evicts it before its next step
            } finally {
                lock.unlock();
            }
        });
    }

    @Override
    public boolean closed() {
        lock.lock();
        try {
            return closed;
        } finally {
            lock.unlock();
        }
    }

    @Override
    public int queueSize() {
        lock.lock();
        try {
            return waiting.size();
        } finally {
            lock.unlock();
        }
    }

    @Override
    public int inFlight() {
        return inFlight;
    }

    @Override
    public int activeDecodeCount() {
        return decoding;
    }

    @Override
    public void setMaxSpeculativeConcurrency(int n) {
        // this loop does not speculate
    }

    @Override
    public void close() {
        lock.lock();
        try {
            closed = true;
            wake.signalAll();
        } finally {
            lock.unlock();
        }
        if (Thread.currentThread() != worker) {
            try {
                worker.join(CLOSE_WAIT_MS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        // the worker has failed its requests; if it is still inside a model call, fail them now (it evicts their
        // KV when the call returns)
        for (CompletableFuture<ChatCompletion> f : List.copyOf(open)) {
            f.completeExceptionally(InferenceEngine.closedError());
        }
    }

    // ------------------------------------------------------------------ the worker

    private void run() {
        try {
            while (awaitWork()) {
                if (!stepApi) {
                    runSerially();
                    continue;
                }
                dropEnded();
                admit();
                prefill();
                decode();
                if (active.isEmpty()) pause(DEFERRED_WAIT_MS);  // admission deferred: the pool is full
            }
        } finally {
            endAll();
        }
    }

    /** Waits (bounded) until there is work; false once closed. */
    private boolean awaitWork() {
        lock.lock();
        try {
            while (true) {
                if (closed) return false;
                if (!active.isEmpty()) return true;
                if (!waiting.isEmpty()) {
                    long waitedNs = System.nanoTime() - waiting.peek().enqueued;
                    long coalesceNs = admitCoalesceMs * 1_000_000L - waitedNs;
                    if (coalesceNs <= 0 || waiting.size() >= maxInFlight) return true;
                    wake.await(coalesceNs, TimeUnit.NANOSECONDS);
                } else {
                    wake.await(IDLE_WAIT_MS, TimeUnit.MILLISECONDS);
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
        } finally {
            lock.unlock();
        }
    }

    private void pause(long ms) {
        lock.lock();
        try {
            if (!closed) wake.await(ms, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            lock.unlock();
        }
    }

    private Queued peek() {
        lock.lock();
        try {
            return waiting.peek();
        } finally {
            lock.unlock();
        }
    }

    private boolean take(Queued q) {
        lock.lock();
        try {
            return waiting.remove(q);
        } finally {
            lock.unlock();
        }
    }

    /** An executor without the step API: the head request through the model's {@code generate}. */
    private void runSerially() {
        Queued q = peek();
        if (q == null || !take(q) || q.handle.future().isDone()) return;
        CompletableFuture<ChatCompletion> f = q.handle.future();
        counters.queueWaitNs.addAndGet(System.nanoTime() - q.enqueued);
        GenerationRequest r = q.request;
        inFlight = 1;
        try {
            GenerationHandle h = q.handle;
            ChatCompletion c = executor.model().generate(q.prompt, r.maxGenLen(), r.temperature(), r.topp(),
                    r.logprobs(), r.seed(), r.listener(), () -> f.isDone() || h.isAborted());
            if (h.isAborted()) {
                f.completeExceptionally(aborted(h));
            } else {
                counters.complete(f, c);
            }
        } catch (Throwable t) {
            f.completeExceptionally(q.handle.isAborted() && !(t instanceof CancellationException) ? aborted(q.handle)
                    : t);
        } finally {
            inFlight = 0;
        }
    }

    /** Evicts requests aborted or whose future completed from outside (timeout, close). */
    private void dropEnded() {
        for (Active a : List.copyOf(active)) {
            if (a.ended()) release(a, a.handle.isAborted() ? aborted(a.handle) : null);
        }
    }

    private static CancellationException aborted(GenerationHandle handle) {
        return new CancellationException("request " + handle.requestId() + " was aborted; its KV was evicted");
    }

    /** Binds queued requests, first come first served, while there is room; a request that does not fit waits. */
    private void admit() {
        while (active.size() < maxInFlight) {
            Queued q = peek();
            if (q == null) return;
            if (q.handle.future().isDone()) {
                take(q);
                continue;
            }
            int maxGen = Math.min(q.request.maxGenLen(), maxSeqLen - q.prompt.length);
            int kv;
            try {
                kv = executor.bind(q.prompt, q.prompt.length + maxGen);
            } catch (KvCacheExhaustedException e) {
                return;
            } catch (Throwable t) {
                take(q);
                q.handle.future().completeExceptionally(t);
                continue;
            }
            if (!take(q) || q.handle.future().isDone()) {
                evictQuietly(kv);
                continue;
            }
            counters.queueWaitNs.addAndGet(System.nanoTime() - q.enqueued);
            Active a = new Active(q, kv, maxGen);
            active.add(a);
            inFlight = active.size();
            try {
                int matched = Math.max(0, Math.min(executor.prefixLen(kv), q.prompt.length));
                a.from = Math.min(matched, q.prompt.length - 1);  // the last prompt token gives the logits
                if (a.listener != null) {
                    a.listener.onInputTokens(q.prompt.length);
                    a.listener.onCachedInputTokens(matched);
                }
            } catch (Throwable t) {
                release(a, t);
            }
        }
    }

    /** Prefills admitted prompts in order, in chunks, at most {@code prefillTokenBudget} tokens this tick. */
    private void prefill() {
        int budget = prefillTokenBudget;
        for (Active a : List.copyOf(active)) {
            if (budget <= 0) return;
            if (a.decoding || a.ended()) continue;
            int to = Math.min(a.prompt.length, a.from + budget);
            try {
                long t0 = System.nanoTime();
                Tensor logits = executor.prefillChunk(a.kv, a.prompt, a.from, to);
                counters.prefillNs.addAndGet(System.nanoTime() - t0);
                budget -= to - a.from;
                a.from = to;
                if (to < a.prompt.length) continue;
                if (a.maxGen == 0) {
                    finish(a, FinishReason.length);
                    continue;
                }
                if (logits == null) {
                    throw new IllegalStateException("prefillChunk returned no logits for the prompt's last chunk");
                }
                float[] data = logits.floatArray();
                a.decoding = true;
                accept(a, data, 0, vocab(logits, 1));
            } catch (Throwable t) {
                release(a, t);
            }
        }
    }

    /** One decode step of up to {@code maxDecodeBatch} decoding rows, taken in turn. */
    private void decode() {
        List<Active> ready = new ArrayList<>();
        for (Active a : active) {
            if (a.decoding) ready.add(a);
        }
        decoding = ready.size();
        if (ready.isEmpty()) return;
        int b = Math.min(maxDecodeBatch, ready.size());
        int start = turn % ready.size();
        turn = start + b;
        List<Active> rows = new ArrayList<>(b);
        int[] ids = new int[b];
        int[] tokens = new int[b];
        int[] positions = new int[b];
        for (int i = 0; i < b; i++) {
            Active a = ready.get((start + i) % ready.size());
            rows.add(a);
            ids[i] = a.kv;
            tokens[i] = a.lastToken;
            positions[i] = a.prompt.length + a.generated - 1;  // where the last token is written
        }
        float[] data;
        int vocab;
        try {
            long t0 = System.nanoTime();
            Tensor logits = executor.decodeStep(ids, tokens, positions);
            counters.decodeNs.addAndGet(System.nanoTime() - t0);
            data = logits.floatArray();
            vocab = vocab(logits, b);
        } catch (Throwable t) {
            for (Active a : rows) release(a, t);
            return;
        }
        for (int i = 0; i < b; i++) {
            Active a = rows.get(i);
            if (a.ended()) {
                release(a, a.handle.isAborted() ? aborted(a.handle) : null);
                continue;
            }
            try {
                accept(a, data, i * vocab, vocab);
            } catch (Throwable t) {
                release(a, t);
            }
        }
        int n = 0;
        for (Active a : active) {
            if (a.decoding) n++;
        }
        decoding = n;
    }

    private static int vocab(Tensor logits, int rows) {
        long[] shape = logits.shape();
        long vocab = shape.length == 0 ? 0 : shape[shape.length - 1];
        if (vocab < 1 || logits.length() != rows * vocab) {
            throw new IllegalStateException("logits of shape " + Arrays.toString(shape) + " for " + rows
                    + " row(s): expected [" + rows + ", vocab]");
        }
        return (int) vocab;
    }

    /** Samples the row's next token, reports it, and ends the request on a stop token or at its length. */
    private void accept(Active a, float[] logits, int offset, int vocab) {
        int token = TokenSampler.next(logits, offset, vocab, a.request.temperature(), a.request.topp(), a.rng);
        a.generated++;
        a.lastToken = token;
        for (int s : stopTokens) {
            if (s == token) {
                finish(a, FinishReason.stop);
                return;
            }
        }
        a.add(token, a.request.logprobs() ? TokenSampler.logprob(logits, offset, vocab, token) : 0f);
        if (a.listener != null) {
            a.listener.onGeneratedTokens(1);
            String text;
            try {
                text = executor.tryDecode(a.tokens(), true);
            } catch (CharacterCodingException e) {
                text = null;  // inside a character: wait for the next token
            }
            emit(a, text);
        }
        if (a.count >= a.maxGen) finish(a, FinishReason.length);
    }

    private void emit(Active a, String text) {
        if (text != null && text.length() > a.emitted.length() && text.startsWith(a.emitted)) {
            String chunk = text.substring(a.emitted.length());
            a.emitted = text;
            a.listener.onText(chunk);
        }
    }

    private void finish(Active a, FinishReason reason) {
        int[] tokens = a.tokens();
        String text = executor.decode(tokens);
        if (a.listener != null) emit(a, text);
        int[] sequence = Arrays.copyOf(a.prompt, a.prompt.length + tokens.length);
        System.arraycopy(tokens, 0, sequence, a.prompt.length, tokens.length);
        int kv = a.kv;
        a.kv = -1;
        try {
            executor.finish(kv, sequence);
        } catch (Throwable t) {
            evictQuietly(kv);
        }
        release(a, null);
        ChatCompletion c = new ChatCompletion(modelName, text, a.prompt, tokens, reason,
                a.request.logprobs() ? Arrays.copyOf(a.logprobs, a.count) : null);
        counters.complete(a.handle.future(), c);
    }

    /** Removes an admitted request (evicting its KV unless finished); fails its future with {@code error}. */
    private void release(Active a, Throwable error) {
        if (a.kv > 0) evictQuietly(a.kv);
        a.kv = -1;
        a.decoding = false;
        active.remove(a);
        inFlight = active.size();
        if (error != null) a.handle.future().completeExceptionally(error);
    }

    private void evictQuietly(int kv) {
        try {
            executor.evict(kv);
        } catch (Throwable ignored) {
            // the request is gone either way
        }
    }

    /** On close: every queued and admitted request fails, admitted ones evicted. */
    private void endAll() {
        List<Queued> queued;
        lock.lock();
        try {
            closed = true;
            queued = new ArrayList<>(waiting);
            waiting.clear();
        } finally {
            lock.unlock();
        }
        for (Queued q : queued) q.handle.future().completeExceptionally(InferenceEngine.closedError());
        for (Active a : List.copyOf(active)) release(a, InferenceEngine.closedError());
        decoding = 0;
    }

    private record Queued(GenerationHandle handle, int[] prompt, GenerationRequest request, long enqueued) {}

    /** An admitted request: the worker's only. */
    private static final class Active {
        final GenerationHandle handle;
        final GenerationRequest request;
        final GenerationListener listener;
        final int[] prompt;
        final int maxGen;
        final Random rng;
        int kv;
        int from;
        boolean decoding;
        int generated;
        int lastToken;
        int[] out = new int[16];
        float[] logprobs = new float[16];
        int count;
        String emitted = "";

        Active(Queued q, int kv, int maxGen) {
            this.handle = q.handle;
            this.request = q.request;
            this.listener = q.request.listener();
            this.prompt = q.prompt;
            this.kv = kv;
            this.maxGen = maxGen;
            this.rng = q.request.seed() == 0 ? new Random() : new Random(q.request.seed());
        }

        boolean ended() {
            return handle.future().isDone() || handle.isAborted();
        }

        void add(int token, float logprob) {
            if (count == out.length) {
                out = Arrays.copyOf(out, count * 2);
                logprobs = Arrays.copyOf(logprobs, count * 2);
            }
            out[count] = token;
            logprobs[count++] = logprob;
        }

        int[] tokens() {
            return Arrays.copyOf(out, count);
        }
    }
}
