"""CompiledLayers: a model's decoder layers run as one ``torch.compile`` (inductor) graph, with
attention, the tensor-parallel sum and the data-dependent blocks as opaque custom ops (piecewise, as
vLLM splits its graph at attention).

Everything between two opaque calls (norms, the fused QKV and MLP matmuls, RoPE, the attention
gates, the residual adds) is traced and fused. Outside the graph stay ``smile::attend`` (write this
window's K/V into the pool, then attend through the planned backend), ``smile::reduce`` (the
tensor-parallel all-reduce) and ``smile::outside`` (a block whose work depends on the data or on
per-request state: a Gated DeltaNet mixer, which advances the rows' recurrent state, and a sparse
mixture of experts, which runs only the experts its tokens picked). They run on the forward's own
context, so the pool, the attention plans, the state pool and the CUDA-graph buffers work as in
eager mode. The ops find that context through ``running``, a context variable the forward sets for
exactly its own duration on its own thread; the compiled code sees only a ``TracedContext``
holding the RoPE tables. An ``outside`` block is named in the graph by its position among the
layers' outside blocks, the same in every model of the structure, and looked up in the running
model's own list: a graph traced for one model runs another model's blocks on that model's
weights and state.

The batch and token dimensions are dynamic, so a handful of variants (torch specialises a
dimension of size 1: one row or more, one token or more) serve every prefill, decode and verify
window, and every model of the same structure in the process shares them (module parameters are
graph inputs). Each variant is compiled once per process and taken from inductor's on-disk cache
(``TORCHINDUCTOR_CACHE_DIR``) by later processes; ``stats`` counts the variants and the seconds
their first calls took.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.experimental._config as _fx_config
from torch import nn

from .forward_context import LayerContext

_CONTEXT: contextvars.ContextVar[LayerContext | None] = contextvars.ContextVar(
    "smile_llm_forward_context", default=None)
# the running model's outside blocks, in the order of ``_outside_blocks``
_BLOCKS: contextvars.ContextVar[tuple[nn.Module, ...]] = contextvars.ContextVar(
    "smile_llm_outside_blocks", default=())
_REGISTER_LOCK = threading.Lock()
_REGISTERED = False
_INDEX = "_smile_outside_index"  # a block's position among its layers' outside blocks


@contextlib.contextmanager
def running(ctx: LayerContext, blocks: tuple[nn.Module, ...] = ()) -> Iterator[None]:
    """Make ``ctx`` the context the custom ops of a compiled forward run, and ``blocks`` the
    model's outside blocks, for the block's duration (this thread and task only)."""
    token, blocks_token = _CONTEXT.set(ctx), _BLOCKS.set(blocks)
    try:
        yield
    finally:
        _BLOCKS.reset(blocks_token)
        _CONTEXT.reset(token)


def _current() -> LayerContext:
    ctx = _CONTEXT.get()
    if ctx is None:
        raise RuntimeError("a compiled layer ran outside its forward (no context is running)")
    return ctx


def outside(module: nn.Module, x: torch.Tensor, ctx: LayerContext,
            with_context: bool = True) -> torch.Tensor:
    """``module.forward(x, ctx)`` (``module.forward(x)`` without ``with_context``), run eagerly
    even inside a compiled graph: there (``ctx`` a ``TracedContext``) an opaque ``smile::outside``
    call on the forward's real context. For a block whose output has ``x``'s shape and whose work
    the graph cannot trace (it depends on the data, or advances per-request state)."""
    if not isinstance(ctx, TracedContext):
        return module.forward(x, ctx) if with_context else module.forward(x)
    index = getattr(module, _INDEX, None)
    if index is None:
        raise RuntimeError(f"{type(module).__name__} is not registered to run outside the graph")
    return torch.ops.smile.outside(x, index, with_context)


def register_ops() -> None:
    """Register ``smile::attend``, ``smile::reduce`` and ``smile::outside`` with torch (once per
    process)."""
    global _REGISTERED
    with _REGISTER_LOCK:
        if _REGISTERED:
            return

        @torch.library.custom_op("smile::attend", mutates_args=())
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
            """``attend`` of the running forward: ``[B*S, H, D]``."""
            out = _current().attend(layer, q, k, v)
            return out.reshape(q.shape[0] * q.shape[1], q.shape[2], q.shape[3]).contiguous()

        @attend.register_fake
        def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
            b, s, h, d = q.shape
            return q.new_empty(b * s, h, d)

        @torch.library.custom_op("smile::reduce", mutates_args=())
        def reduce(x: torch.Tensor) -> torch.Tensor:
            """``reduce`` of the running forward (the tensor-parallel sum)."""
            return _current().reduce(x.clone())

        @reduce.register_fake
        def _(x: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(x)

        @torch.library.custom_op("smile::outside", mutates_args=())
        def run_outside(x: torch.Tensor, index: int, with_context: bool) -> torch.Tensor:
            """The running model's outside block ``index`` over ``x`` on the running forward (see
            ``outside``)."""
            module = _BLOCKS.get()[index]
            out = module.forward(x, _current()) if with_context else module.forward(x)
            return out.contiguous()

        @run_outside.register_fake
        def _(x: torch.Tensor, index: int, with_context: bool) -> torch.Tensor:
            return torch.empty_like(x)

        _REGISTERED = True


@dataclass
class TracedContext:
    """What the compiled layers see of their forward (``LayerContext``): the RoPE tables as graph
    inputs; attention, the tensor-parallel sum (``tp``: whether to sum at all) and ``outside``
    blocks as custom ops on the running forward."""

    cos: torch.Tensor
    sin: torch.Tensor
    tp: bool = False
    states: Any = None  # (LayerContext's field: the outside blocks read the real context's)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.ops.smile.attend(q, k, v, layer)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.smile.reduce(x) if self.tp else x

    def commit(self) -> None:  # the forward commits its own context
        raise RuntimeError("a compiled graph never commits")


@dataclass
class CompileStats:
    """``variants`` compiled in this process and the ``seconds`` their first calls took (tracing and
    compiling, or loading from inductor's cache), with the ``shapes`` ``[B, S, D]`` that made
    each."""

    variants: int = 0
    seconds: float = 0.0
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, variants: int, seconds: float, shape: tuple[int, ...]) -> None:
        """Count ``variants`` made by one call of ``shape`` that took ``seconds``."""
        with self._lock:
            self.variants += variants
            self.seconds += seconds
            self.shapes.append(shape)


def _outside_blocks(layers: Iterable[nn.Module]) -> Iterator[nn.Module]:
    """The blocks of ``layers`` that run through ``outside``: DeltaNet mixers and sparse MoEs."""
    from .gated_deltanet import GatedDeltaNet
    from .moe import SparseMoe

    for layer in layers:
        for module in layer.modules():
            if isinstance(module, (GatedDeltaNet, SparseMoe)):
                yield module


class CompiledLayers:
    """``layers`` (decoder layers: ``forward(x, ctx)``) run as one compiled graph (see the module
    docstring); ``backend``: torch.compile's (inductor). Layers of the same structure (the same
    modules with the same parameter shapes and dtypes) share one compiled function, and with it its
    variants; each structure has its own, so a process serving several models never runs into
    torch's limit on one function's variants (``torch._dynamo.config.recompile_limit``)."""

    def __init__(self, layers: nn.ModuleList, backend: str = "inductor") -> None:
        register_ops()
        self.blocks = tuple(_outside_blocks(layers))
        for index, block in enumerate(self.blocks):  # the same positions in every model of it
            object.__setattr__(block, _INDEX, index)
        self.layers = layers
        self.stats = CompileStats()
        self._fn, self._code = _function_for(layers, backend)

    @property
    def variants(self) -> int:
        """The variants compiled so far for this structure in this process (every model sharing
        it counts them)."""
        return _variants(self._code)

    def __call__(self, x: torch.Tensor, ctx: LayerContext, tp: bool) -> torch.Tensor:
        """The layers over ``x`` ``[B, S, D]`` within the forward ``ctx``; ``tp``: whether
        row-parallel blocks sum over tensor-parallel ranks."""
        # fresh contiguous RoPE tables: a view's storage offset and strides would be guarded on
        traced = TracedContext(ctx.cos.clone(memory_format=torch.contiguous_format),
                               ctx.sin.clone(memory_format=torch.contiguous_format), tp)
        for t in (x, traced.cos, traced.sin):  # the batch and token dimensions, and only they
            torch._dynamo.mark_dynamic(t, 0)
            torch._dynamo.mark_dynamic(t, 1)
        before = _variants(self._code)
        t0 = time.perf_counter()
        # size-oblivious: a batch of one row shares the graph of more rows
        oblivious = _fx_config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]
        with running(ctx, self.blocks), oblivious:
            out = self._fn(list(self.layers), x, traced)
        made = _variants(self._code) - before
        if made > 0:  # this call traced and compiled (or loaded from inductor's cache)
            self.stats.record(made, time.perf_counter() - t0, tuple(x.shape))
        return out


def _run_layers(layers: list[nn.Module], x: torch.Tensor, ctx: TracedContext) -> torch.Tensor:
    for layer in layers:
        x = layer.forward(x, ctx)
    return x


_FUNCTIONS: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def _structure(layers: nn.ModuleList) -> tuple[Any, ...]:
    """What makes two layer stacks compile alike, module by module: its type, the plain values the
    traced code may read as constants (``eps``, ``layer_idx``, head counts, ...) and its
    parameters' shapes, dtypes and devices. The compiled functions skip torch's guards on modules,
    so this key is what keeps a graph to the layers it was traced for."""
    def plain(m: nn.Module) -> tuple[Any, ...]:
        return tuple(sorted((k, v) for k, v in vars(m).items()
                            if not k.startswith("_") and isinstance(v, (bool, int, float, str))))

    return tuple((type(m).__qualname__, plain(m),
                  tuple((tuple(p.shape), p.dtype, str(p.device))
                        for p in m.parameters(recurse=False)))
                 for m in layers.modules())


def _function_for(layers: nn.ModuleList, backend: str) -> tuple[Any, Any]:
    """The compiled function of this structure of layers (and its code object): one per structure
    and backend, each over its own copy of ``_run_layers``' code (torch keys its variants, and
    their limit, by code object)."""
    key = (_structure(layers), backend)
    with _REGISTER_LOCK:
        if key not in _FUNCTIONS:
            code = _run_layers.__code__.replace(co_name=f"_run_layers_{len(_FUNCTIONS)}")
            fn = types.FunctionType(code, _run_layers.__globals__, code.co_name)
            # no guards on the modules: the structure key stands for them, and checking every
            # parameter on every call would cost what compiling saves
            options: dict[str, str | int | bool | Callable[..., Any]] = {
                "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
            _FUNCTIONS[key] = (torch.compile(fn, backend=backend, options=options), code)
        return _FUNCTIONS[key]


def _variants(code: Any) -> int:
    """The compiled variants torch holds for ``code``."""
    return len(torch._dynamo.eval_frame._debug_get_cache_entry_list(code))
