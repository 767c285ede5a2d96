package smile.llm;

import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.SubmissionPublisher;

/** Helpers for {@link GenerationListener}s. */
public final class GenerationListeners {
    private GenerationListeners() {}

    /** A listener forwarding only {@code onText} to {@code publisher}. */
    public static GenerationListener toPublisher(SubmissionPublisher<String> publisher) {
        Objects.requireNonNull(publisher, "publisher");
        return new GenerationListener() {
            @Override
            public void onText(String chunk) {
                publisher.submit(chunk);
            }
        };
    }

    /**
     * Fans every callback out to {@code listeners} in argument order, ignoring nulls; null when there is nothing
     * to compose, the listener itself when there is one.
     */
    public static GenerationListener compose(GenerationListener... listeners) {
        List<GenerationListener> all = new ArrayList<>();
        if (listeners != null) {
            for (GenerationListener l : listeners) {
                if (l != null) all.add(l);
            }
        }
        if (all.isEmpty()) return null;
        if (all.size() == 1) return all.get(0);
        GenerationListener[] list = all.toArray(new GenerationListener[0]);
        return new GenerationListener() {
            @Override public void onInputTokens(int n) { for (GenerationListener l : list) l.onInputTokens(n); }
            @Override public void onCachedInputTokens(int n) { for (GenerationListener l : list) l.onCachedInputTokens(n); }
            @Override public void onGeneratedTokens(int n) { for (GenerationListener l : list) l.onGeneratedTokens(n); }
            @Override public void onThinkingTokens(int n) { for (GenerationListener l : list) l.onThinkingTokens(n); }
            @Override public void onText(String chunk) { for (GenerationListener l : list) l.onText(chunk); }
        };
    }
}
