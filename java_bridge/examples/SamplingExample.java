import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import smile.llm.Completion;
import smile.llm.Message;
import smile.llm.SamplingParams;
import smile.llm.python.Bridge;
import smile.llm.python.ChatMessage;
import smile.llm.python.PythonLanguageModel;
import smile.llm.python.TemplateMessage;

/**
 * The full sampling surface from Java: a {@link SamplingParams} builder, a blocking {@code Stream} of text, n samples
 * of one prompt, top-k logprobs, and a chat turn rendered by the model's own chat template. Run through the
 * launcher: {@code python -m java_bridge --classpath out --main SamplingExample [--model DIR] -- [newTokens]}.
 */
public final class SamplingExample {
    public static void main(String[] args) {
        PythonLanguageModel lm = Bridge.languageModel();
        int n = args.length > 0 ? Integer.parseInt(args[0]) : 48;
        int[] prompt = lm.encode("def parse(text):\n");

        // 1. Greedy, then greedy with a repetition penalty and a bias against the space token (id 32 here).
        SamplingParams greedy = SamplingParams.builder().maxNewTokens(n).build();
        SamplingParams penalised = greedy.toBuilder().repetitionPenalty(1.3).logitBias(Map.of(32, -1.0)).build();
        System.out.println("greedy:    " + lm.generate(prompt, greedy).text().replace("\n", "\\n"));
        System.out.println("penalised: " + lm.generate(prompt, penalised).text().replace("\n", "\\n"));

        // 2. A blocking stream of text chunks; leaving the try block closes it, which cancels the request.
        SamplingParams sampled = SamplingParams.builder().maxNewTokens(n).temperature(0.8).topK(40).minP(0.05)
                .seed(7).build();
        System.out.print("streamed:  ");
        try (Stream<String> chunks = lm.streamText(prompt, sampled)) {
            chunks.forEach(chunk -> System.out.print(chunk.replace("\n", "\\n")));
        }
        System.out.println();

        // 3. Four samples of one prompt: its KV is computed once and shared.
        List<Completion> samples = lm.generateSamples(prompt, sampled.toBuilder().n(4).maxNewTokens(24).build());
        for (int i = 0; i < samples.size(); i++) {
            System.out.println("sample " + i + ":  " + samples.get(i).text().replace("\n", "\\n"));
        }

        // 4. The three most likely tokens at each of the first positions.
        Completion c = lm.generate(prompt, greedy.toBuilder().maxNewTokens(3).logprobs(3).build());
        for (int i = 0; i < c.tokens().length; i++) {
            System.out.println("token " + i + ": " + c.tokens()[i] + ", top 3 " + c.topLogprobs().get(i));
        }

        // 5. A chat turn on the model's chat template (the embedded models carry a ChatML one): Smile's Message[]
        //    form, then the bridge's list form (Smile's Messages and ChatMessages) with a template variable.
        Message[] dialog = {Message.system("You answer in one line."), Message.user("What is a radix tree?")};
        try {
            System.out.println("assistant: " + lm.chat(dialog, n, 0.0, 1.0, false, 0, null).content());
            List<TemplateMessage> chat = List.of(dialog[0], dialog[1], ChatMessage.assistant("A prefix tree."),
                    ChatMessage.user("And a trie?"));
            Map<String, Object> vars = Map.of("enable_thinking", false);  // read by templates that know it
            System.out.println("chat prompt: " + lm.encodeChat(chat, true, vars).length + " tokens");
            System.out.println("assistant: " + lm.chat(chat, vars, greedy, null).text());
        } catch (IllegalArgumentException e) {
            System.out.println("chat: skipped, " + e.getMessage());
        }

        // 6. A bad setting is refused by name before anything is queued.
        try {
            lm.generate(prompt, SamplingParams.builder().topK(-1).build());
        } catch (IllegalArgumentException e) {
            System.out.println("refused: " + e.getMessage());
        }
        System.out.println("pool: " + lm.kvCachePool().boundRequestCount() + " bound");
    }
}
