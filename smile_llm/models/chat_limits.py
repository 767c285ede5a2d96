"""The budget of one chat-template render: how long it may run and how much text it may build.

A chat template is code from the checkpoint folder; these limits (enforced by
``chat_sandbox.BoundedSandbox``) keep a hostile or broken one from blocking the caller or exhausting
memory. Each is far above what a real chat template needs (they render in milliseconds, to prompts
of at most a few hundred thousand characters).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_RENDER_SECONDS = 5.0  # wall time of one render
# characters of the rendered prompt, and of any one string or list a template builds
MAX_RENDER_CHARS = 8 << 20
# all expression output of one render, wherever it goes: this many times MAX_RENDER_CHARS
PRODUCED_CHARS_FACTOR = 4
MAX_RANGE = 100_000  # items of one range()
MAX_CALL_DEPTH = 64  # nested macro / recursive-loop calls
MAX_INT_BITS = 1 << 16  # bits of an integer built by * or **


@dataclass(frozen=True)
class RenderLimits:
    """The budget of one render: wall ``seconds``, ``chars`` (the rendered prompt and any one string
    or list built; ``PRODUCED_CHARS_FACTOR`` times it for all expression output), ``range`` items
    and call ``depth``. The defaults are the module's constants; tests pass smaller ones."""

    seconds: float = MAX_RENDER_SECONDS
    chars: int = MAX_RENDER_CHARS
    range: int = MAX_RANGE
    depth: int = MAX_CALL_DEPTH

    def __post_init__(self) -> None:
        if not self.seconds > 0 or min(self.chars, self.range, self.depth) < 1:
            raise ValueError(f"render limits must be positive, got {self}")
