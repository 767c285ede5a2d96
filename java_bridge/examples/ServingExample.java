import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Flow;
import java.util.concurrent.TimeUnit;
import smile.llm.Completion;
import smile.llm.GenerationListener;
import smile.llm.cache.KvCachePool;
import smile.llm.engine.GenerationHandle;
import smile.llm.engine.GenerationRequest;
import smile.llm.engine.InferenceEngine;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * Serving from Java: futures from one thread, cancellation, a streaming publisher and an engine with its own batch
 * size, all batched on the model's one scheduler. Run through the launcher:
 * {@code python -m java_bridge --classpath out --main ServingExample -- [newTokens]}.
 */
public final class ServingExample {
    public static void main(String[] args) throws Exception {
        PythonLanguageModel lm = Bridge.languageModel();
        KvCachePool pool = lm.kvCachePool();
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 32;

        // 1. Eight requests in flight from one thread: submit returns at once, the model batches them.
        List<CompletableFuture<Completion>> futures = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            futures.add(lm.submit(lm.encode("def handler_" + i + "(request):\n"), n, 0.0, 1.0, false, 0, null));
        }
        CompletableFuture.allOf(futures.toArray(new CompletableFuture[0])).get(120, TimeUnit.SECONDS);
        for (int i = 0; i < futures.size(); i++) {
            Completion c = futures.get(i).join();
            // greedy: the same tokens as Smile's generate() called alone
            int[] alone = lm.generate(c.prompt(), n, 0.0, 1.0, false, 0, null).completionTokens();
            if (!java.util.Arrays.equals(alone, c.tokens())) throw new AssertionError("request " + i + " differs");
            System.out.println("future " + i + ": " + c.tokens().length + " tokens, " + c.finishReason()
                    + ", equal to generate() alone");
        }

        // 2. Cancel a running request: its pages are free when cancel returns.
        CountDownLatch started = new CountDownLatch(1);
        CompletableFuture<Completion> longOne = lm.submit(lm.encode("class Parser:\n"), 500, 0.0, 1.0, false, 0,
                new GenerationListener() {
                    @Override public void onText(String chunk) { started.countDown(); }
                });
        started.await(60, TimeUnit.SECONDS);
        longOne.cancel(true);
        System.out.println("cancelled: " + longOne.isCancelled() + ", requests bound: " + pool.boundRequestCount());

        // 3. Stream text through a Flow.Publisher, one chunk per request(1).
        CountDownLatch done = new CountDownLatch(1);
        StringBuilder text = new StringBuilder();
        lm.stream(lm.encode("import os\n"), n, 0.0, 1.0, 0).subscribe(new Flow.Subscriber<String>() {
            private Flow.Subscription s;
            @Override public void onSubscribe(Flow.Subscription s) { this.s = s; s.request(1); }
            @Override public void onNext(String chunk) { text.append(chunk); s.request(1); }
            @Override public void onError(Throwable t) { t.printStackTrace(); done.countDown(); }
            @Override public void onComplete() { done.countDown(); }
        });
        done.await(60, TimeUnit.SECONDS);
        System.out.println("streamed " + text.length() + " characters");

        // 4. An engine: at most two requests at once, 256 prompt tokens per step; Smile's request and handle.
        try (InferenceEngine engine = lm.engine(2, 256)) {
            List<GenerationHandle> handles = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                handles.add(engine.submit(GenerationRequest.ofTokens(lm.encode("x = " + i + "\n"), n, 0.7, 0.95,
                        false, 100 + i, null)));
            }
            for (GenerationHandle h : handles) {
                System.out.println("engine request " + h.requestId() + ": "
                        + h.future().get(60, TimeUnit.SECONDS).completionTokens().length + " tokens");
            }
            System.out.println("engine: maxInFlight " + engine.maxInFlight() + ", prefillTokenBudget "
                    + engine.prefillTokenBudget());
        }
        pool.checkInvariants();
        System.out.println("pool: " + pool.boundRequestCount() + " bound, invariants hold");
    }
}
