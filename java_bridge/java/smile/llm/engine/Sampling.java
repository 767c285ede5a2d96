package smile.llm.engine;

import java.util.concurrent.ThreadLocalRandom;
import smile.deep.tensor.ScalarType;
import smile.deep.tensor.Tensor;

/**
 * Smile's next-token sampling, on the bridge's host tensors. Differences from Smile (whose methods run LibTorch
 * kernels on the tensor's device): the draw at {@code temperature > 0} uses {@link ThreadLocalRandom}, not
 * torch's generator, so {@code smile_manual_seed} does not make it repeatable; {@code mergeWithPromptMask} does not
 * broadcast (its three tensors hold the same number of elements).
 */
public final class Sampling {
    private Sampling() {}

    /**
     * The next token of each row of {@code logits} ({@code Float} or {@code Double}, the last dimension the
     * vocabulary): the argmax at {@code temperature <= 0}, else a draw from the top-p nucleus of the softmax of
     * {@code logits / temperature}. Returns an {@code Int64} tensor of shape {@code [rows]}.
     */
    public static Tensor sampleNext(Tensor logits, double temperature, double topp) {
        if (logits.dim() == 0 || logits.size(-1) == 0) {
            throw new IllegalArgumentException("logits must have a non-empty last dimension: " + logits);
        }
        float[] data;
        if (logits.dtype() == ScalarType.Float) {
            data = logits.floatArray();
        } else if (logits.dtype() == ScalarType.Double) {
            double[] d = logits.doubleArray();
            data = new float[d.length];
            for (int i = 0; i < d.length; i++) data[i] = (float) d[i];
        } else {
            throw new IllegalArgumentException("logits must be Float or Double: " + logits);
        }
        int vocab = (int) logits.size(-1);
        long[] next = new long[data.length / vocab];
        for (int r = 0; r < next.length; r++) {
            next[r] = TokenSampler.next(data, r * vocab, vocab, temperature, topp, ThreadLocalRandom.current());
        }
        return Tensor.of(next);
    }

    /**
     * {@code currentTokens} where {@code textMask} is true (a prompt position), else {@code nextToken}: Smile's
     * {@code Tensor.where(textMask, currentTokens, nextToken)}. {@code textMask} is {@code Bool}; the tokens are
     * both {@code Int32} or both {@code Int64}; the result has {@code currentTokens}' dtype and shape.
     */
    public static Tensor mergeWithPromptMask(Tensor textMask, Tensor currentTokens, Tensor nextToken) {
        if (textMask.dtype() != ScalarType.Bool) {
            throw new IllegalArgumentException("textMask must be Bool: " + textMask);
        }
        if (textMask.length() != currentTokens.length() || nextToken.length() != currentTokens.length()) {
            throw new IllegalArgumentException("textMask, currentTokens and nextToken must hold as many elements: "
                    + textMask + ", " + currentTokens + ", " + nextToken);
        }
        byte[] mask = textMask.byteArray();
        if (currentTokens.dtype() == ScalarType.Int64 && nextToken.dtype() == ScalarType.Int64) {
            long[] out = currentTokens.longArray();
            long[] next = nextToken.longArray();
            for (int i = 0; i < out.length; i++) if (mask[i] == 0) out[i] = next[i];
            return Tensor.of(out, currentTokens.shape());
        }
        if (currentTokens.dtype() == ScalarType.Int32 && nextToken.dtype() == ScalarType.Int32) {
            int[] out = currentTokens.intArray();
            int[] next = nextToken.intArray();
            for (int i = 0; i < out.length; i++) if (mask[i] == 0) out[i] = next[i];
            return Tensor.of(out, currentTokens.shape());
        }
        throw new IllegalArgumentException("currentTokens and nextToken must both be Int32 or both Int64: "
                + currentTokens + ", " + nextToken);
    }
}
