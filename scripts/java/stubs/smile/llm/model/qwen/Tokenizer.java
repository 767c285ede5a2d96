package smile.llm.model.qwen;

import java.nio.charset.CharacterCodingException;
import smile.llm.Message;

/** Stub of Smile's Qwen tokenizer (out of the bridge's scope). */
public class Tokenizer {
    public static Tokenizer of(String path) { throw new UnsupportedOperationException(); }
    public void requireChatSpecialsInVocab(int vocabSize) { throw new UnsupportedOperationException(); }
    public int specialToken(String token) { throw new UnsupportedOperationException(); }
    public int size() { throw new UnsupportedOperationException(); }
    public int pad() { throw new UnsupportedOperationException(); }
    public int[] stopTokens() { throw new UnsupportedOperationException(); }
    public int[] encode(String text, boolean bos, boolean eos) { throw new UnsupportedOperationException(); }
    public int[] encodeDialog(Message... dialog) { throw new UnsupportedOperationException(); }
    public String decode(int[] tokens) { throw new UnsupportedOperationException(); }
    public String tryDecode(int[] tokens, boolean skipSpecial) throws CharacterCodingException {
        throw new UnsupportedOperationException();
    }
}
