package bridgetest.apps;

import smile.llm.LanguageModel;
import smile.llm.python.Bridge;

/** Asks for the model: with --no-model, Bridge.languageModel() throws IllegalStateException and this exits 1. */
public class ModelApp {
    public static void main(String[] args) {
        LanguageModel lm = Bridge.languageModel();
        System.out.println("ModelApp vocab=" + lm.vocabSize());
    }
}
