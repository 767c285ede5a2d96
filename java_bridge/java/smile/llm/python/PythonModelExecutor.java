package smile.llm.python;

import smile.llm.engine.ModelExecutor;

/**
 * The {@link ModelExecutor} of the bridged Python model ({@link PythonLanguageModel#executor()}), implemented in
 * Python. {@link smile.llm.engine.InferenceEngine} recognises it and serves its requests on the model's Python
 * serving loop ({@link #attachEngine}) instead of driving the step API. The step API works for callers that drive the
 * model themselves ({@link #supportsStepApi()} answers true): each call runs the Python forward over the model's
 * pool between two steps of its serving loop, so it may come from any thread while other callers generate; requests
 * bound here are this executor's (the serving loop never sees them, and ids it did not bind are refused with
 * {@link IllegalArgumentException}) and hold their pages until {@link #finish} or {@link #evict}.
 */
public interface PythonModelExecutor extends ModelExecutor {
    /** The bridged model. */
    @Override
    PythonLanguageModel model();

    /**
     * Attaches the model's Python engine ({@code smile_llm.InferenceEngine}) with at most {@code maxInFlight}
     * requests running and {@code prefillTokenBudget} prompt tokens prefilled per step.
     * {@link IllegalStateException} while another engine is attached.
     */
    PythonServingEngine attachEngine(int maxInFlight, int prefillTokenBudget);
}
