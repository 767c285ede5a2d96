"""GenerationListener: optional callbacks of one generate() call, in Smile's order: ``on_input_tokens`` and
``on_cached_input_tokens`` once after binding, then ``on_generated_tokens`` and ``on_text`` (never empty) as tokens
come. ``on_thinking_tokens`` is reserved."""

from __future__ import annotations



class GenerationListener:
    """Subclass and override what you need; every method is a no-op by default."""

    def on_input_tokens(self, n: int) -> None:
        """Called once after binding with the prompt's token count."""
        ...

    def on_cached_input_tokens(self, n: int) -> None:
        """Called once after binding with the prompt tokens served from the prefix cache (0 on a miss)."""
        ...

    def on_generated_tokens(self, n: int) -> None:
        """Called with the count of newly generated tokens (1 per token, including each accepted draft)."""
        ...

    def on_thinking_tokens(self, n: int) -> None:
        """Reserved (Smile's name); never called."""
        ...

    def on_token(self, token_id: int) -> None:
        """Called with each generated token's id, before its text (a Python extension of Smile's interface)."""
        ...

    def on_text(self, chunk: str) -> None:
        """Called with each new piece of decoded text (never empty; a UTF-8 character is never split)."""
        ...

