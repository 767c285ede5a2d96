package smile.llm.engine;

import java.util.Random;

/** Choosing the next token from one row of logits ({@code data[offset, offset + vocab)}), on the host. */
final class TokenSampler {
    private TokenSampler() {}

    /** The argmax at {@code temperature <= 0}, else a draw from the top-p nucleus of the tempered softmax. */
    static int next(float[] data, int offset, int vocab, double temperature, double topp, Random rng) {
        if (temperature <= 0) return argmax(data, offset, vocab);
        double max = data[offset + argmax(data, offset, vocab)];
        double[] p = new double[vocab];
        double sum = 0;
        for (int i = 0; i < vocab; i++) {
            p[i] = Math.exp((data[offset + i] - max) / temperature);
            sum += p[i];
        }
        Integer[] order = new Integer[vocab];
        for (int i = 0; i < vocab; i++) order[i] = i;
        java.util.Arrays.sort(order, (a, b) -> Double.compare(p[b], p[a]));
        // the smallest set of most likely tokens whose probability reaches topp (at least one token)
        int kept = 0;
        double mass = 0;
        // (tokens of probability 0 never enter it, so rounding at the end of the draw cannot pick one)
        while (kept < vocab && p[order[kept]] > 0 && (kept == 0 || mass < topp * sum)) {
            mass += p[order[kept++]];
        }
        double u = rng.nextDouble() * mass;
        for (int k = 0; k < kept; k++) {
            u -= p[order[k]];
            if (u < 0) return order[k];
        }
        return order[kept - 1];
    }

    /** The log probability of {@code token} under the untempered softmax of the row. */
    static float logprob(float[] data, int offset, int vocab, int token) {
        double max = data[offset + argmax(data, offset, vocab)];
        double sum = 0;
        for (int i = 0; i < vocab; i++) sum += Math.exp(data[offset + i] - max);
        return (float) (data[offset + token] - max - Math.log(sum));
    }

    private static int argmax(float[] data, int offset, int vocab) {
        int best = 0;
        for (int i = 1; i < vocab; i++) {
            if (data[offset + i] > data[offset + best]) best = i;
        }
        return best;
    }
}
