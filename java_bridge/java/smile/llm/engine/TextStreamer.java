package smile.llm.engine;

import java.nio.charset.CharacterCodingException;
import java.util.Arrays;
import java.util.function.BiFunction;
import smile.llm.GenerationListener;

/**
 * Smile's incremental detokenizer: collects generated token ids and hands the listener the text of each chunk of
 * at least {@code chunkTokens} new tokens ({@link #DEFAULT_CHUNK_TOKENS} by default), or of what is left on a forced
 * emit. A chunk whose decoding fails with a {@link CharacterCodingException} (as the cause of a runtime exception:
 * an incomplete multi-byte character) stays pending until more tokens arrive. Tokens beyond {@code maxTokens} are
 * ignored. Pure Java, as in Smile.
 */
public final class TextStreamer {
    /** Tokens per chunk when none is given. */
    public static final int DEFAULT_CHUNK_TOKENS = 20;

    private final BiFunction<int[], Boolean, String> tryDecode;
    private final int chunkTokens;
    private final int[] tokens;
    private int size;
    private int emitted;

    /** A streamer of at most {@code maxTokens} tokens, emitting {@link #DEFAULT_CHUNK_TOKENS} at a time. */
    public TextStreamer(int maxTokens, BiFunction<int[], Boolean, String> tryDecode) {
        this(maxTokens, DEFAULT_CHUNK_TOKENS, tryDecode);
    }

    /**
     * @param maxTokens   the most tokens kept ({@code >= 1}, else {@link IllegalArgumentException}).
     * @param chunkTokens tokens per chunk (at least 1 is used).
     * @param tryDecode   decodes {@code (tokens, skipSpecial)}; called with {@code skipSpecial} true.
     */
    public TextStreamer(int maxTokens, int chunkTokens, BiFunction<int[], Boolean, String> tryDecode) {
        if (maxTokens < 1) {
            throw new IllegalArgumentException("maxTokens must be >= 1");
        }
        this.tokens = new int[maxTokens];
        this.chunkTokens = Math.max(1, chunkTokens);
        this.tryDecode = tryDecode;
    }

    /** Adds a generated token (ignored once {@code maxTokens} are held). */
    public void accept(int tokenId) {
        if (size < tokens.length) {
            tokens[size++] = tokenId;
        }
    }

    /**
     * Sends the pending tokens' text to {@code listener.onText} when a full chunk is pending or {@code force} is
     * set; nothing for a null listener, no pending token or an empty text.
     */
    public void maybeEmit(GenerationListener listener, boolean force) {
        int pending = size - emitted;
        if (listener == null || pending <= 0 || (!force && pending < chunkTokens)) {
            return;
        }
        String text;
        try {
            text = tryDecode.apply(Arrays.copyOfRange(tokens, emitted, size), true);
        } catch (RuntimeException e) {
            if (e.getCause() instanceof CharacterCodingException) {
                return;  // an incomplete character: wait for the next tokens
            }
            throw e;
        }
        emitted = size;
        if (text != null && !text.isEmpty()) {
            listener.onText(text);
        }
    }
}
