"""GenerationListener: optional callbacks of one generate() call, in Smile's order:
``on_input_tokens`` and ``on_cached_input_tokens`` once after binding, then ``on_generated_tokens``
and ``on_text`` (never empty) as tokens come. ``on_thinking_tokens`` is reserved. A plain callable
given as a listener (``listener=print``, a lambda) receives the text chunks:
``ServingContext.request`` wraps it in a ``TextCallback``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any



class GenerationListener:
    """Subclass and override what you need; every method is a no-op by default."""

    def on_input_tokens(self, n: int) -> None:
        """Called once after binding with the prompt's token count."""
        ...

    def on_cached_input_tokens(self, n: int) -> None:
        """Called once after binding with the prompt tokens served from the prefix cache (0 on a
        miss)."""
        ...

    def on_generated_tokens(self, n: int) -> None:
        """Called with the count of newly generated tokens (1 per token, including each accepted
        draft)."""
        ...

    def on_thinking_tokens(self, n: int) -> None:
        """Reserved (Smile's name); never called."""
        ...

    def on_token(self, token_id: int) -> None:
        """Called with each generated token's id, before its text (a Python extension of Smile's
        interface)."""
        ...

    def on_text(self, chunk: str) -> None:
        """Called with each new piece of decoded text (never empty; a UTF-8 character is never
        split)."""
        ...


# an object with any of these is a listener
LISTENER_EVENTS = ("on_input_tokens", "on_cached_input_tokens", "on_generated_tokens",
                   "on_thinking_tokens", "on_token", "on_text")


class TextCallback(GenerationListener):
    """A listener that hands each text chunk to ``fn`` (``fn(chunk)``, like ``on_text``); what
    ``fn`` returns is ignored, and what it raises fails its request alone (as from any listener)."""

    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn

    def on_text(self, chunk: str) -> None:
        self.fn(chunk)

    def __repr__(self) -> str:
        return f"TextCallback({self.fn!r})"


# what a caller may pass as ``listener``: a GenerationListener (an object with some of its methods
# is accepted at run time too), a callable that receives each text chunk, or None
Listener = GenerationListener | Callable[[str], object] | None
