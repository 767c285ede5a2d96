package smile.chat;

import smile.llm.Message;

/** Stub of the serve module's request body (out of the bridge's scope). */
public class CompletionRequest {
    public Message[] messages;
    public double temperature;
    public double topP;
    public boolean logprobs;
    public long seed;

    public int resolveMaxTokens(int maxSeqLen, int promptLen) { throw new UnsupportedOperationException(); }
}
