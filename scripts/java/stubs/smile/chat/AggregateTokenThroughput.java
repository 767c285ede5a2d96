package smile.chat;

/** Stub (out of the bridge's scope). */
public class AggregateTokenThroughput {
}
