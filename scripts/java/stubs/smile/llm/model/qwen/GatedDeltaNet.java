package smile.llm.model.qwen;

/** Stub (out of the bridge's scope). */
public class GatedDeltaNet {
    public void setStatePool(DeltaNetStatePool pool) { throw new UnsupportedOperationException(); }
}
