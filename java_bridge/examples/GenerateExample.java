import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;

import smile.llm.ChatCompletion;
import smile.llm.GenerationListener;
import smile.llm.cache.KvCacheExhaustedException;
import smile.llm.cache.KvCacheLayout;
import smile.llm.cache.KvCachePool;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * A JVM application on the Python-backed {@code smile.llm} API. Run it through the launcher (see README.md):
 *
 * <pre>
 * python -m java_bridge --classpath out --main GenerateExample -- "def fibonacci(n):\n" [maxTokens]
 * </pre>
 *
 * Part 1 generates from the launcher's model with Smile's {@code LanguageModel.generate}, streaming text through a
 * {@link GenerationListener}, then generates again from the same prompt to show the prefix cache. Part 2 drives a
 * small {@link KvCachePool} directly: bind, put/get through native-order direct buffers, finish, a prefix-matching
 * second bind, the radix tree, the audit, and a {@link KvCacheExhaustedException}.
 */
public class GenerateExample {
    public static void main(String[] args) {
        String prompt = args.length > 0 ? args[0].replace("\\n", "\n") : "def fibonacci(n):\n";
        int maxTokens = args.length > 1 ? Integer.parseInt(args[1]) : 120;
        generate(prompt, maxTokens);
        pool();
    }

    // ------------------------------------------------------------------------------------------ part 1: generate()
    /** Streams every text chunk to System.out as it arrives and records the input counts. */
    static final class Streamer implements GenerationListener {
        int inputTokens;
        int cachedInputTokens;
        int chunks;

        @Override public void onInputTokens(int n) { inputTokens = n; }
        @Override public void onCachedInputTokens(int n) { cachedInputTokens = n; }
        @Override public void onText(String chunk) {
            chunks++;
            System.out.print(chunk);
            System.out.flush();
        }
    }

    static void generate(String prompt, int maxTokens) {
        PythonLanguageModel lm = Bridge.languageModel();  // Smile's LanguageModel plus the bridge's calls
        int[] ids = lm.encode(prompt);
        System.out.println("== generate: model " + lm.name() + " (" + lm.family() + "), vocab " + lm.vocabSize()
                + ", maxSeqLen " + lm.maxSeqLen() + ", prompt " + ids.length + " tokens; " + maxTokens
                + " new tokens, temperature 0.7, top-p 0.95, seed 7");
        String first = null;
        for (int run = 1; run <= 2; run++) {
            Streamer streamer = new Streamer();
            System.out.println("-- run " + run + " --");
            System.out.print(prompt);  // the completion continues the prompt
            System.out.flush();
            long t0 = System.nanoTime();
            ChatCompletion c = lm.generate(ids, maxTokens, 0.7, 0.95, false, 7L, streamer);
            double ms = (System.nanoTime() - t0) / 1e6;
            System.out.println();
            System.out.println("-- finish reason: " + c.reason() + "; " + c.completionTokens().length
                    + " tokens in " + String.format("%.0f ms", ms) + ", " + streamer.chunks
                    + " text chunks; listener saw " + streamer.inputTokens + " input tokens, "
                    + streamer.cachedInputTokens + " cached");
            if (!c.content().isEmpty() && streamer.chunks == 0) {
                throw new AssertionError("text was generated but no chunk was streamed");
            }
            if (first == null) {
                first = c.content();
            } else {
                // Sampling is seeded by (seed, position), so the cached second run gives the same text.
                System.out.println("-- same text as run 1: " + first.equals(c.content()) + "; "
                        + (streamer.cachedInputTokens > 0
                        ? streamer.cachedInputTokens + " prompt tokens' KV came from the prefix cache"
                        : "no prompt KV reused: the cache holds whole pages, and a prompt needs more than one page"));
            }
        }
    }

    // ------------------------------------------------------------------------------------------ part 2: the pool
    static ByteBuffer direct(int floats) {
        return ByteBuffer.allocateDirect(floats * Float.BYTES).order(ByteOrder.nativeOrder());
    }

    /** A value that encodes (layer, position, head, dim), negated for V. */
    static float value(int layer, int pos, int head, int dim, boolean v) {
        float x = layer * 10000 + pos * 100 + head * 10 + dim;
        return v ? -x : x;
    }

    /** Checks that {@code k}/{@code v} hold positions [0, len) of {@code layer}; returns the values checked. */
    static int check(ByteBuffer k, ByteBuffer v, int layer, int len, int heads, int dim) {
        int i = 0;
        for (int p = 0; p < len; p++) {
            for (int h = 0; h < heads; h++) {
                for (int d = 0; d < dim; d++, i++) {
                    float gotK = k.getFloat(i * Float.BYTES), gotV = v.getFloat(i * Float.BYTES);
                    if (gotK != value(layer, p, h, d, false) || gotV != value(layer, p, h, d, true)) {
                        throw new AssertionError("layer " + layer + " position " + p + " head " + h + " dim " + d
                                + ": got K " + gotK + " V " + gotV + ", want " + value(layer, p, h, d, false));
                    }
                }
            }
        }
        return 2 * i;
    }

    static void pool() {
        int layers = 2, heads = 2, dim = 8, batch = 2, seq = 64;
        // forTesting: page size 1, float32, maxBatchSize * maxSeqLen slots
        KvCachePool pool = Bridge.forTesting(new KvCacheLayout(layers, heads, dim, batch, seq));
        System.out.println();
        System.out.println("== pool: " + pool.numLayers() + " layers x " + pool.numKvHeads() + " KV heads x head_dim "
                + pool.headDim() + ", " + pool.numSlots() + " slots, page size " + pool.pageSize() + ", "
                + pool.dtype() + "; " + pool.freePages() + " free pages");

        int[] prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
        int len = prompt.length;
        int id = pool.bindRequest(prompt, 16);
        System.out.println("bindRequest(10 tokens, capacity 16) -> id " + id + ", matchedPrefixLen "
                + pool.matchedPrefixLen(id) + ", free pages " + pool.freePages());
        pool.activateStep(id);

        // K and V as [B=1, len, heads, dim] float32 in native-order direct buffers (Python views them, no copy)
        ByteBuffer k = direct(len * heads * dim), v = direct(len * heads * dim);
        ByteBuffer kOut = direct(len * heads * dim), vOut = direct(len * heads * dim);
        int checked = 0;
        for (int layer = 0; layer < layers; layer++) {
            int i = 0;
            for (int p = 0; p < len; p++) {
                for (int h = 0; h < heads; h++) {
                    for (int d = 0; d < dim; d++, i++) {
                        k.putFloat(i * Float.BYTES, value(layer, p, h, d, false));
                        v.putFloat(i * Float.BYTES, value(layer, p, h, d, true));
                    }
                }
            }
            pool.put(layer, 0, len, k, v);
        }
        for (int layer = 0; layer < layers; layer++) {
            pool.get(layer, len, kOut, vOut);
            checked += check(kOut, vOut, layer, len, heads, dim);
        }
        System.out.println("put/get of " + len + " positions x " + layers + " layers: " + checked
                + " values read back equal; kvLen " + pool.kvLen(id));

        pool.finishRequest(id, prompt);
        System.out.println("finishRequest -> bound " + pool.boundRequestCount() + ", radix tree holds "
                + pool.radixCache().totalSize() + " tokens (" + pool.radixCache().evictableSize() + " evictable)");

        // A longer prompt with the same first 10 tokens reuses their KV from the tree.
        int[] longer = Arrays.copyOf(prompt, len + 4);
        for (int i = len; i < longer.length; i++) longer[i] = 30 + i;
        int id2 = pool.bindRequest(longer, 24);
        int matched = pool.matchedPrefixLen(id2);
        System.out.println("bindRequest(14 tokens sharing 10) -> id " + id2 + ", matchedPrefixLen " + matched
                + ", radixCache().matchPrefix: " + pool.radixCache().matchPrefix(longer).length() + " slots, protected "
                + pool.radixCache().protectedSize());
        if (matched != len) throw new AssertionError("expected a " + len + "-token prefix match, got " + matched);
        pool.activateStep(id2);
        checked = 0;
        for (int layer = 0; layer < layers; layer++) {
            pool.get(layer, len, kOut, vOut);  // the shared prefix pages: request 1's K/V
            checked += check(kOut, vOut, layer, len, heads, dim);
        }
        System.out.println("request " + id2 + " reads the cached prefix: " + checked + " values equal");

        try {
            pool.put(0, len, 1, ByteBuffer.allocate(heads * dim * 4), ByteBuffer.allocate(heads * dim * 4));
        } catch (IllegalArgumentException e) {
            System.out.println("IllegalArgumentException (heap buffer): " + e.getMessage());
        }
        try {
            pool.bindRequest(new int[] {1}, 100_000);
            throw new AssertionError("an oversized bind should have failed");
        } catch (KvCacheExhaustedException e) {
            System.out.println("KvCacheExhaustedException: " + e.getMessage());
        }
        System.out.println("after the failed bind: request " + id2 + " still bound: " + pool.isBound(id2));

        pool.unbindRequest(id2);
        pool.checkInvariants();
        System.out.println("checkInvariants: passed");
        System.out.println("statsJson: " + pool.statsJson());
        pool.close();
    }
}
