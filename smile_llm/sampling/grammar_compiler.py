"""GrammarCompiler: one model's compiled grammars. It builds the grammar engine's token table from
the model's tokenizer on the first constrained request (``token_table``), and the duplicate-key
guard's table from it on the first JSON one (``key_guard.KeyTable``), compiles each constraint
once, on a compile thread (``compile_thread``: the engine recurses as it builds a grammar), and
keeps the last ``CACHE_SIZE`` compiled (LRU), so a repeated schema does not recompile. Every
request then starts from its own copy of the compiled matcher (``CompiledGrammar.start``). Safe
from any thread."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ..errors import ConstraintError, GrammarError
from ..text.tokenizer import Tokenizer
from .compile_thread import on_compile_thread
from .constraint import Constraint
from .grammar_state import GrammarState
from .key_guard import KeyTable
from .token_mask import allowed_count
from .token_table import token_table

CACHE_SIZE = 64  # compiled grammars kept per model
# the engine's limits on one grammar: its size (symbols) and the work of one mask
MAX_GRAMMAR_SIZE = 200_000
STEP_LEXER_FUEL = 200_000
STEP_MAX_ITEMS = 50_000
# tokens a new grammar must be able to force from its start when compiled: a recursion that
# forces without end fails here, at the call, rather than while generating
COMPILE_FORCED_TOKENS = 16


def parser_limits() -> Any:
    """llguidance's ``LLParserLimits`` for every grammar of this package (a grammar over them is
    refused when compiled; a mask over them fails its request alone)."""
    from llguidance import LLParserLimits

    return LLParserLimits(max_grammar_size=MAX_GRAMMAR_SIZE, step_lexer_fuel=STEP_LEXER_FUEL,
                          step_max_items=STEP_MAX_ITEMS, verbose_errors=False)


class CompiledGrammar:
    """A constraint compiled against one model's token table; ``start`` gives each request its own
    state. ``constraint``: what it was compiled from."""

    def __init__(self, constraint: Constraint, matcher: Any, vocab_size: int,
                 eos_token_ids: tuple[int, ...], lock: threading.Lock,
                 keys: KeyTable | None = None) -> None:
        self.constraint = constraint
        self._matcher, self._lock = matcher, lock
        self.vocab_size, self.eos_token_ids = vocab_size, eos_token_ids
        # the key guard of a JSON output (None: the constraint has no JSON objects)
        self._keys = None if keys is None or constraint.keys is None else (keys, constraint.keys)

    def start(self) -> GrammarState:
        """A fresh state at the grammar's start (a copy of the compiled matcher)."""
        with self._lock:
            matcher = self._matcher.deep_copy()
        return GrammarState(matcher, self.vocab_size, self.eos_token_ids,
                            field=self.constraint.field, keys=self._keys)


class GrammarCompiler:
    """The compiled grammars of a model with ``tokenizer`` and ``vocab_size`` logits, whose
    ``eos_token_ids`` end a grammar (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int,
                 eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_token_ids = tuple(e for e in eos_token_ids if 0 <= e < vocab_size)
        self._table: Any = None
        self._keys: KeyTable | None = None
        self._cache: OrderedDict[Constraint, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # the tables, the cache and copies of compiled matchers
        self.compiled = 0  # grammars compiled (cache misses)

    def table(self) -> Any:
        """The engine's token table of this model (built on first use)."""
        with self._lock:
            if self._table is None:
                self._table = token_table(self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._table

    def key_table(self) -> KeyTable:
        """The duplicate-key guard's table of this model (built on first use, outside the lock:
        about a second for a vocabulary of 150,000 tokens)."""
        table = self.table()
        if self._keys is None:
            keys = KeyTable.of(table, int(table.vocab_size))
            with self._lock:
                if self._keys is None:
                    self._keys = keys
        assert self._keys is not None
        return self._keys

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """``constraint`` compiled (from the cache when it was compiled recently).
        ConstraintError naming the constraint's field and quoting the engine's message when the
        engine refuses it (a schema it cannot compile, a regex or grammar with an error, a grammar
        over ``parser_limits``), when no token of the model can begin an output it allows, or when
        the engine fails forcing its first ``COMPILE_FORCED_TOKENS`` tokens (a recursion that
        forces without end)."""
        from llguidance import LLMatcher

        table = self.table()
        keys = self.key_table() if constraint.keys is not None else None
        with self._lock:
            hit = self._cache.get(constraint)
            if hit is not None:
                self._cache.move_to_end(constraint)
                return hit
        # compiled outside the lock (a large grammar takes a while and drops the GIL), on a
        # compile thread (the engine recurses as it builds the grammar)
        matcher = on_compile_thread(lambda: LLMatcher(table, constraint.source, log_level=0,
                                                      limits=parser_limits()))
        if matcher.is_error():
            raise ConstraintError(f"the grammar engine refused it: {matcher.get_error()}",
                                  field=constraint.field)
        # the table's width: the mask's (a byte table over a small vocabulary may be wider)
        compiled = CompiledGrammar(constraint, matcher, int(table.vocab_size), self.eos_token_ids,
                                   self._lock, keys)
        state = compiled.start()
        try:
            first = state.mask()
        except GrammarError as exc:
            raise ConstraintError(f"no token of the model can begin an output it allows "
                                  f"({_reason(exc)})", field=constraint.field) from None
        if allowed_count(first, self.vocab_size) == 0:
            raise ConstraintError("no token of the model can begin an output it allows",
                                  field=constraint.field)
        try:
            state.forced(COMPILE_FORCED_TOKENS)
        except GrammarError as exc:
            raise ConstraintError(f"the grammar engine fails on the output's first tokens: "
                                  f"{_reason(exc)}", field=constraint.field) from None
        with self._lock:
            self.compiled += 1
            self._cache[constraint] = compiled
            self._cache.move_to_end(constraint)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


def _reason(exc: GrammarError) -> str:
    """A grammar error's message without the field a ``GrammarLimitError`` leads with."""
    if isinstance(exc, ConstraintError):
        return str(exc)[len(exc.field) + 2:]
    return str(exc)
