package bridgetest.apps;

import smile.llm.SamplingParams;
import smile.llm.python.Bridge;
import smile.llm.python.PythonLanguageModel;

/**
 * Asks for the model: with --no-model, Bridge.languageModel() throws IllegalStateException and this exits 1.
 * Otherwise it prints the vocabulary size and the stats of a short greedy generation.
 */
public class ModelApp {
    public static void main(String[] args) {
        PythonLanguageModel lm = Bridge.languageModel();
        System.out.println("ModelApp vocab=" + lm.vocabSize());
        System.out.println("ModelApp stats=" + lm.generate(lm.encode("def f(x):\n"),
                SamplingParams.builder().maxNewTokens(8).build()).statsJson());
    }
}
