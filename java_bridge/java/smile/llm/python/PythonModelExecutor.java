package smile.llm.python;

import smile.llm.engine.ModelExecutor;

/**
 * The {@link ModelExecutor} of the bridged Python model ({@link PythonLanguageModel#executor()}), implemented in
 * Python. {@link smile.llm.engine.InferenceEngine} recognises it and serves its requests on the model's Python
 * serving loop ({@link #attachEngine}) instead of driving the step API, which this executor does not offer: the step
 * methods throw {@link UnsupportedOperationException} and {@link #supportsStepApi()} answers false.
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
