package smile.llm.python;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Builds {@link smile.llm.Completion}'s top-k and prompt logprob lists from the arrays the bridge passes. */
public final class Logprobs {
    private Logprobs() {}

    /**
     * One unmodifiable map per row, {@code ids[i][j] -> values[i][j]} in the given order; a null row stays null
     * (the first prompt token has no logprob). Null when {@code ids} is null. IllegalArgumentException when the
     * shapes differ.
     */
    public static List<Map<Integer, Float>> maps(int[][] ids, float[][] values) {
        if (ids == null) return null;
        if (values == null || values.length != ids.length) {
            throw new IllegalArgumentException("logprob ids and values differ in length");
        }
        List<Map<Integer, Float>> out = new ArrayList<>(ids.length);
        for (int i = 0; i < ids.length; i++) {
            if (ids[i] == null) {
                out.add(null);
                continue;
            }
            if (values[i] == null || values[i].length != ids[i].length) {
                throw new IllegalArgumentException("logprob ids and values of row " + i + " differ in length");
            }
            Map<Integer, Float> row = new LinkedHashMap<>();
            for (int j = 0; j < ids[i].length; j++) row.put(ids[i][j], values[i][j]);
            out.add(Collections.unmodifiableMap(row));
        }
        return Collections.unmodifiableList(out);
    }
}
