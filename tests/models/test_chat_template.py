"""Chat templates: ``encode_chat`` renders the checkpoint's own template (``chat_template.jinja`` or
``tokenizer_config.json``) to exactly the token ids of transformers' ``apply_chat_template`` (system, user,
assistant and tool turns, tools, thinking on and off); ``chat`` generates the assistant's turn and a growing
conversation reuses its earlier turns' KV; bad conversations and missing templates are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from smile_llm.language_model import LanguageModel

from tests.hf_zoo import TOKENIZER_SENTENCES, VOCAB, zoo  # noqa: F401 - fixture

CHATML = """{%- if tools %}
{{- '<|im_start|>system\\n# Tools\\n' }}
  {% for tool in tools %}
{{ tool | tojson }}
  {% endfor %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
{{- raise_exception('unknown role: ' + message.role) }}
{%- endif %}
{%- if message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}"""

CONVERSATION = [
    {"role": "system", "content": "the radix tree remembers every prefix"},
    {"role": "user", "content": "the quick brown fox jumps"},
    {"role": "assistant", "content": "a small model writes a small answer"},
    {"role": "tool", "content": "paged attention keeps keys"},
    {"role": "user", "content": "tokens flow from the prompt into the cache"},
]
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "finds a prefix ü",
                                           "parameters": {"type": "object", "properties": {}}}}]


def chat_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["<unk>", "<eos>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(TOKENIZER_SENTENCES * 3, trainer)
    return tok


@pytest.fixture(scope="module")
def folder(zoo, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811 - the fixture above
    base = zoo("qwen3")
    out = tmp_path_factory.mktemp("chat")
    for f in base.path.iterdir():
        shutil.copy(f, out / f.name)
    chat_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML, "eos_token": "<|im_end|>",
        "unk_token": "<unk>", "bos_token": None, "pad_token": None}))
    return out


@pytest.fixture(scope="module")
def lm(folder: Path) -> LanguageModel:
    model = LanguageModel.from_pretrained(folder, page_size=4, max_seq_len=256, drafter=None)
    yield model
    model.close()


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("variables", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_encode_chat_equals_transformers_apply_chat_template(lm, folder, generation_prompt, variables, tools):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    want = hf.apply_chat_template(CONVERSATION, tools=tools, add_generation_prompt=generation_prompt,
                                  tokenize=True, **variables)
    want = list(want["input_ids"]) if isinstance(want, dict) or hasattr(want, "keys") else list(want)
    got = lm.encode_chat(CONVERSATION, add_generation_prompt=generation_prompt, tools=tools, **variables)
    assert got == want
    assert lm.tokenizer.encode("<|im_start|>") == [2]  # the special tokens are single ids


def test_the_template_file_wins_over_the_config(folder: Path, tmp_path: Path) -> None:
    other = tmp_path / "m"
    shutil.copytree(folder, other)
    (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }} dog{% endfor %}")
    lm = LanguageModel.from_pretrained(other, page_size=4, max_seq_len=64, drafter=None)
    try:
        assert lm.encode_chat([{"role": "user", "content": "the fox"}]) == lm.encode("the fox dog")
    finally:
        lm.close()


def test_chat_generates_the_next_turn_and_reuses_the_earlier_turns(lm) -> None:
    first = lm.chat(CONVERSATION[:2], 6, chat_template_kwargs={"enable_thinking": False})
    assert first.prompt_tokens == lm.encode_chat(CONVERSATION[:2], enable_thinking=False)
    assert first.tokens == lm.generate(first.prompt_tokens, 6).tokens
    turn = CONVERSATION[:2] + [{"role": "assistant", "content": lm.decode(first.tokens) or "ok"},
                               {"role": "user", "content": "the lazy dog"}]
    second = lm.chat(turn, 6)
    assert second.stats["cached_tokens"] >= 4  # the first turn's KV, through the prefix cache


def test_chat_takes_tools_as_an_argument_or_a_template_variable(lm) -> None:
    direct = lm.chat(CONVERSATION[:2], 4, tools=TOOLS)
    assert direct.prompt_tokens == lm.encode_chat(CONVERSATION[:2], tools=TOOLS)
    assert lm.chat(CONVERSATION[:2], 4, chat_template_kwargs={"tools": TOOLS}).tokens == direct.tokens
    with pytest.raises(ValueError, match="tools given twice"):
        lm.chat(CONVERSATION[:2], 4, tools=TOOLS, chat_template_kwargs={"tools": TOOLS})


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"content": "x"}], r"messages\[0\]\['role'\]"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\]"),
    ([{"role": "narrator", "content": "x"}], "unknown role: narrator"),
])
def test_bad_conversations_are_refused_by_name(lm, messages, match) -> None:
    with pytest.raises(ValueError, match=match):
        lm.chat(messages, 4)
    assert lm.pool.bound_request_count == 0


def test_a_checkpoint_without_a_template_names_the_files_it_looked_for(zoo) -> None:  # noqa: F811
    lm = LanguageModel.from_pretrained(zoo("qwen3").path, page_size=4, max_seq_len=64, drafter=None)
    try:
        with pytest.raises(ValueError, match="chat_template.jinja and 'chat_template' in tokenizer_config.json"):
            lm.encode_chat([{"role": "user", "content": "hi"}])
    finally:
        lm.close()


def test_the_chat_command_streams_each_turn_and_reuses_the_conversation(folder: Path) -> None:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "smile_llm", "chat", "--model", str(folder), "--max-new-tokens", "5",
                          "--temperature", "0"], input="the quick brown fox\nthe lazy dog\n\n", capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    cached = [int(line.split()[0].lstrip("[")) for line in run.stdout.splitlines() if "prompt tokens cached]" in line]
    assert len(cached) == 2 and cached[0] == 0 and cached[1] > 0


def test_the_chat_command_refuses_a_model_without_a_template(zoo) -> None:  # noqa: F811
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "smile_llm", "chat", "--model", str(zoo("qwen3").path)],
                         input="hi\n", capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no chat template" in run.stderr
