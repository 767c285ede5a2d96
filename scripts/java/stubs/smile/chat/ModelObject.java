package smile.chat;

/** Stub of the serve module's OpenAI model object (out of the bridge's scope). */
public record ModelObject(String id, long created, String ownedBy, String kind) {
    public static final String UNKNOWN_OWNER = "Unknown";
    public static final String KIND_LLM = "LLM";

    public static ModelObject of(String id, long created, String ownedBy, String kind, Object smile, Object onnx,
                                 LlmModelDetails llm) {
        throw new UnsupportedOperationException();
    }
}
