package smile.chat;

import smile.llm.GenerationListener;

/** Stub of the serve module's throughput listener (out of the bridge's scope). */
public class TokenThroughputLogger implements GenerationListener {
    public TokenThroughputLogger(AggregateTokenThroughput aggregate) {}

    public void setRequestId(long id) { throw new UnsupportedOperationException(); }
    public void finish() { throw new UnsupportedOperationException(); }
}
