"""PromptTokens: the prompt token ids a request body will have on a replica, worked out at the
ingress from the model folder's tokenizer and chat template, without its weights. The router
scores replicas by them. Anything that does not parse gives None (no routing hint): the replica's
app answers it with the proper error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...text.chat_template import ChatTemplate
from ...models.checkpoint.config import ModelConfig
from ...text.tokenizer import load_tokenizer
from ..app import chat_inputs
from ..protocol import ChatCompletionRequest, CompletionRequest

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"


class PromptTokens:
    """The tokenizer and chat template of the model in ``folder`` (its config is checked as the
    model's loader checks it)."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        config = ModelConfig.from_pretrained(folder)
        self.tokenizer = load_tokenizer(folder, config.eos_token_ids, config.vocab_size)
        self.template = ChatTemplate.from_folder(folder)

    def of(self, path: str, body: bytes) -> tuple[str, list[int] | None]:
        """The prompt text and token ids of a request to ``path`` with ``body``: for chat the
        rendered conversation, for completions a text prompt or its ids; ("", None) for any other
        request or a body that does not parse."""
        try:
            if path == CHAT_PATH and self.template is not None:
                messages, tools = chat_inputs(ChatCompletionRequest.model_validate(
                    json.loads(body)))
                text = self.template.render(messages, True, tools)
                return text, list(self.tokenizer.encode(text))
            if path == COMPLETIONS_PATH:
                prompt: Any = CompletionRequest.model_validate(json.loads(body)).prompt
                if isinstance(prompt, str):
                    return prompt, list(self.tokenizer.encode(prompt))
                if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                    return "", list(prompt)
        except Exception:  # noqa: BLE001 - no hint: the replica's app answers (a 400 naming it)
            pass
        return "", None
