"""The shipped byte-level models' Hugging Face tokenizer files (``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``, written by ``scripts/make_byte_tokenizer.py``): ``transformers.AutoTokenizer`` and the
``tokenizers`` library tokenize exactly as the package's ``ByteTokenizer`` (fixed texts, random text, random ids),
the ChatML template renders the same in transformers and in the package, and the package itself keeps its byte
tokenizer (``smile_tokenizer.json`` takes precedence), so chat, generate and structured output work out of the box.

One documented difference: the ``tokenizers`` library alone maps the text ``<|endoftext|>`` to id 256 (it does not
read ``tokenizer_config.json``); ``AutoTokenizer`` reads ``split_special_tokens: true`` there and encodes that text
as its 13 bytes, as ``ByteTokenizer`` does."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from smile_llm.language_model import LanguageModel
from smile_llm.text.chat_template import ChatTemplate
from smile_llm.models.shipped import DEFAULT_DRAFT_DIR, DEFAULT_MODEL_DIRS
from smile_llm.text.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

REPO = Path(__file__).resolve().parents[2]
FOLDERS = [DEFAULT_MODEL_DIRS["dense"], DEFAULT_MODEL_DIRS["hybrid"], DEFAULT_DRAFT_DIR]
IDS = [f.name for f in FOLDERS]
EOS_TEXT = "<|endoftext|>"
TEXTS = [
    "", "a", " ", "hello world", "def main(argv):\n    return 0\n",
    "héllo wörld, ça va? Ñandú", "e\u0301 (a decomposed é) and \u00e9", "\u00ad\ufeff\u200b\u200d zero widths",
    "😀 👍🏽 👨‍👩‍👧 🇫🇷", "中文 日本語 한국어 العربية עברית", "\n\n\t\t  \r\n   \x0b\x0c \u3000 x  ",
    "\x00\x01\x7f\x80 controls", "  leading and trailing  ", "<|im_start|>user\nhi<|im_end|>\n",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", "\U0010ffff\ue000 edges",
]
CONVERSATIONS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "über 😀"},
                  {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "two "},
                                               {"type": "text", "text": "parts"}]}]},
    {"messages": [{"role": "system", "content": "You help."}, {"role": "user", "content": "weather in Paris?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [{"type": "function", "function": {"name": "weather",
                                                                    "arguments": {"city": "Paris", "days": 2}}},
                                  {"type": "function", "function": {"name": "time",
                                                                    "arguments": "{\"zone\": \"CET\"}"}}]},
                  {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "noon"},
                  {"role": "user", "content": "thanks"}],
     "tools": [{"type": "function", "function": {"name": "weather", "description": "the forecast, ü",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}},
               {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}}]},
    {"messages": [{"role": "user", "content": "call it"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
]


def random_text(rng: random.Random, length: int) -> str:
    """Random valid text: ASCII, Latin, BMP and astral code points (no surrogates)."""
    out = []
    for _ in range(length):
        top = rng.choice([0x80, 0x800, 0x10000, 0x110000])
        c = rng.randrange(top)
        out.append(chr(c if not 0xD800 <= c < 0xE000 else c - 0x800))
    return "".join(out)


@pytest.fixture(scope="module")
def script() -> Any:
    spec = importlib.util.spec_from_file_location("make_byte_tokenizer", REPO / "scripts" / "make_byte_tokenizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=FOLDERS, ids=IDS)
def hf(request: pytest.FixtureRequest) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(request.param)


@pytest.fixture(scope="module")
def lm() -> Any:
    model = LanguageModel.default(max_seq_len=1024, max_batch_size=2)
    yield model
    model.close()


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_the_shipped_files_are_what_the_script_writes(script: Any, folder: Path) -> None:
    pytest.importorskip("tokenizers")
    for name, text in script.files(folder).items():
        assert (folder / name).read_text(encoding="utf-8") == text, f"{folder.name}/{name}: run {script.__file__}"


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_the_tokenizers_library_reads_the_byte_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert tok.get_vocab_size() == config["vocab_size"] == 257
    assert tok.token_to_id(EOS_TEXT) == 256 and tok.token_to_id("<|im_start|>") is None
    assert [t.content for t in tok.get_added_tokens_decoder().values()] == [EOS_TEXT]
    byte = ByteTokenizer()
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False).ids == byte.encode(text), repr(text)
        assert tok.decode(byte.encode(text) + [256]) == text
    # the one difference: without tokenizer_config.json the special token's text is the special token
    assert tok.encode(f"a{EOS_TEXT}", add_special_tokens=False).ids == [97, 256]


def test_auto_tokenizer_matches_the_byte_tokenizer_on_fixed_texts(hf: Any) -> None:
    byte = ByteTokenizer()
    for text in TEXTS + [EOS_TEXT, f"x{EOS_TEXT}y{EOS_TEXT}"]:
        ids = byte.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids, repr(text)
        assert hf(text)["input_ids"] == ids, repr(text)  # no bos or eos added either
        assert hf.decode(ids + [256], skip_special_tokens=True) == byte.decode(ids + [256]) == text
    # the text <|endoftext|> is its bytes, never the special id (a prompt cannot forge the end of text)
    assert 256 not in hf.encode(f"a{EOS_TEXT}b", add_special_tokens=False)
    assert hf.decode([256]) == EOS_TEXT and hf.decode([256], skip_special_tokens=True) == ""


def test_auto_tokenizer_names_the_special_tokens_and_the_length(hf: Any) -> None:
    folder = Path(hf.name_or_path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert (hf.eos_token, hf.eos_token_id, hf.bos_token_id, hf.pad_token_id) == (EOS_TEXT, 256, 256, 256)
    assert len(hf) == 257 and hf.model_max_length == config["max_position_embeddings"]
    # ChatML's markers are plain text of these models, not tokens
    assert "<|im_start|>" not in hf.get_vocab() and "<|im_end|>" not in hf.get_vocab()
    assert hf.encode("<|im_start|>", add_special_tokens=False) == list(b"<|im_start|>")


def test_auto_tokenizer_matches_the_byte_tokenizer_on_random_text(hf: Any) -> None:
    rng = random.Random(1234)
    byte = ByteTokenizer()
    texts = [random_text(rng, rng.randrange(1, 80)) for _ in range(300)]
    for text in texts:
        assert hf.encode(text, add_special_tokens=False) == byte.encode(text), repr(text)
    assert hf(texts)["input_ids"] == [byte.encode(t) for t in texts]  # batched too
    joined = "".join(texts)
    assert hf.decode(byte.encode(joined)) == joined


def test_auto_tokenizer_decodes_random_ids_as_the_byte_tokenizer(hf: Any) -> None:
    rng = random.Random(99)
    byte = ByteTokenizer()
    for _ in range(300):
        text = random_text(rng, rng.randrange(0, 20))
        ids = byte.encode(text)
        for _ in range(rng.randrange(3)):  # end-of-text ids anywhere
            ids.insert(rng.randrange(len(ids) + 1), 256)
        assert hf.decode(ids, skip_special_tokens=True) == byte.decode(ids) == text
    for _ in range(300):  # any ids, valid UTF-8 or not: invalid bytes become U+FFFD alike
        ids = [rng.randrange(257) for _ in range(rng.randrange(1, 40))]
        assert hf.decode(ids, skip_special_tokens=True) == byte.decode(ids), ids


@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_the_chat_template_renders_the_same_in_transformers_and_the_package(hf: Any, case: int,
                                                                            generation_prompt: bool) -> None:
    conv = CONVERSATIONS[case]
    template = ChatTemplate.from_folder(Path(hf.name_or_path))
    assert template is not None
    ours = template.render(conv["messages"], generation_prompt, conv.get("tools"))
    theirs = hf.apply_chat_template(conv["messages"], tools=conv.get("tools"), tokenize=False,
                                    add_generation_prompt=generation_prompt)
    assert ours == theirs
    assert hf.encode(theirs, add_special_tokens=False) == ByteTokenizer().encode(ours)
    assert ours.endswith("<|im_start|>assistant\n") == generation_prompt


def test_the_template_is_chatml_with_hermes_tools() -> None:
    template = ChatTemplate.from_folder(DEFAULT_MODEL_DIRS["dense"])
    assert template is not None
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "A"}]
    assert template.render(messages) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                                         "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>assistant\n")
    assert template.render(messages, add_generation_prompt=False).endswith("A<|im_end|>\n")
    tools = CONVERSATIONS[3]["tools"]
    text = template.render(CONVERSATIONS[3]["messages"], tools=tools)
    lines = text.split("\n")
    at = lines.index("<tools>")
    assert [json.loads(line) for line in lines[at + 1: at + 1 + len(tools)]] == tools  # one JSON a line
    assert lines[at + 1 + len(tools)] == "</tools>"
    assert text.startswith("<|im_start|>system\nYou help.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1  # the system message joins the tools block
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in text
    assert ('<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
            '<tool_call>\n{"name": "time", "arguments": {"zone": "CET"}}\n</tool_call><|im_end|>') in text
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nnoon\n"
            "</tool_response><|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n") in text


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_the_package_keeps_its_byte_tokenizer_for_the_shipped_folders(folder: Path) -> None:
    tok = load_tokenizer(folder, (256,), 257)
    assert type(tok) is ByteTokenizer and tok.vocab_size == 257 and tok.eos_token_ids == (256,)


def test_smile_tokenizer_json_takes_precedence_over_tokenizer_json(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    folder = DEFAULT_MODEL_DIRS["dense"]
    shutil.copy(folder / "tokenizer.json", tmp_path / "tokenizer.json")
    hf_tok = load_tokenizer(tmp_path, (256,), 257)  # tokenizer.json alone: read by the tokenizers library
    assert isinstance(hf_tok, HFTokenizer) and hf_tok.vocab_size == 257
    for text in TEXTS:
        assert hf_tok.encode(text) == ByteTokenizer().encode(text)
        assert hf_tok.decode(hf_tok.encode(text) + [256]) == text
    (tmp_path / "smile_tokenizer.json").write_text(json.dumps({"vocab_size": 300, "eos_token_id": 299}))
    both = load_tokenizer(tmp_path, (256,), 257)
    assert type(both) is ByteTokenizer and both.vocab_size == 300 and both.eos_token_ids == (299,)


def test_the_default_model_chats_out_of_the_box(lm: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def main("}]
    ids = lm.encode_chat(messages)
    rendered = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\ndef main(<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert ids == list(rendered.encode("utf-8")) == lm.encode(lm.chat_template.render(messages))
    reply = lm.chat(messages, 12)
    plain = lm.generate(rendered, 12)
    assert reply.prompt_tokens == ids and reply.tokens == plain.tokens and reply.text == plain.text
    tools = CONVERSATIONS[4]["tools"]
    with_tools = lm.chat(CONVERSATIONS[4]["messages"], 6, tools=tools)
    assert bytes(with_tools.prompt_tokens).decode("utf-8").startswith("<|im_start|>system\n# Tools\n")
    assert lm.pool.bound_request_count == 0


def test_structured_output_still_uses_the_byte_token_table(lm: Any) -> None:
    assert type(lm.tokenizer) is ByteTokenizer
    out = lm.generate("x", 10, regex="[a-z]+")
    assert out.text and out.text.isalpha() and out.text.islower() and out.text.isascii()
    assert lm.pool.bound_request_count == 0
