package bridgetest.apps;

import smile.llm.LanguageModel;
import smile.llm.python.Bridge;

/**
 * Asks for the model: with --no-model, Bridge.languageModel() throws IllegalStateException and this exits 1.
 * Otherwise it prints the vocabulary size and the stats of a short greedy generation.
 */
public class ModelApp {
    public static void main(String[] args) {
        LanguageModel lm = Bridge.languageModel();
        System.out.println("ModelApp vocab=" + lm.vocabSize());
        System.out.println("ModelApp stats=" + lm.generate(lm.encode("def f(x):\n"), 8, 0, 1, false, 0, null)
                .statsJson());
    }
}
