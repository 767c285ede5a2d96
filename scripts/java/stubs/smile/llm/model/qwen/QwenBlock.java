package smile.llm.model.qwen;

/** Stub (out of the bridge's scope). */
public class QwenBlock {
    public GatedDeltaNet linearAttn;
}
