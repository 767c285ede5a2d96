"""``lm.stream`` and ``lm.astream``: the chunks add up to exactly what ``generate`` returns (text and token ids,
plain and speculative), leaving the loop early cancels the request and releases its KV, and bad input raises at
the call."""

from __future__ import annotations

import asyncio
import time

import pytest

from smile_llm import LanguageModel


@pytest.fixture(scope="module")
def lm() -> LanguageModel:
    return LanguageModel.default(max_seq_len=512)


def released(lm: LanguageModel, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if lm.pool.bound_request_count == 0:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("speculative_tokens", [0, 3])
def test_the_chunks_add_up_to_generate(lm, speculative_tokens) -> None:
    want = lm.generate("def main(argv):\n", 40, speculative_tokens=speculative_tokens)
    chunks = list(lm.stream("def main(argv):\n", 40, speculative_tokens=speculative_tokens))
    assert "".join(c.text for c in chunks) == want.text
    assert [t for c in chunks for t in c.token_ids] == want.tokens
    assert len(chunks) > 1 and all(c.text or c.token_ids for c in chunks)


def test_a_stop_string_is_never_streamed(lm) -> None:
    want = lm.generate("import os\n", 60, stop=["\n\n"])
    chunks = list(lm.stream("import os\n", 60, stop=["\n\n"]))
    assert "".join(c.text for c in chunks) == want.text and "\n\n" not in want.text


def test_leaving_the_loop_cancels_the_request_and_releases_its_kv(lm) -> None:
    seen = 0
    for chunk in lm.stream("import os\n", 400, speculative_tokens=0):
        seen += len(chunk.token_ids)
        if seen >= 3:
            break
    assert released(lm, timeout=3.0)  # cancelled: running on to 400 tokens would take several times longer
    lm.pool.check_invariants()


def test_async_chunks_add_up_to_generate_and_an_early_exit_cancels(lm) -> None:
    want = lm.generate("class Tree:\n", 30, speculative_tokens=0)

    async def collect(limit: int | None):
        out = []
        async for chunk in lm.astream("class Tree:\n", 30 if limit is None else 400, speculative_tokens=0):
            out.append(chunk)
            if limit is not None and len(out) >= limit:
                break
        return out

    chunks = asyncio.run(collect(None))
    assert "".join(c.text for c in chunks) == want.text
    assert [t for c in chunks for t in c.token_ids] == want.tokens
    asyncio.run(collect(2))
    assert released(lm, timeout=3.0)


def test_bad_input_raises_at_the_call(lm) -> None:
    with pytest.raises(ValueError, match="top_k"):
        lm.stream("x", 4, top_k=-1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lm.stream([300], 4)
    assert lm.pool.bound_request_count == 0
