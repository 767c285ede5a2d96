"""ServingLoop: the one serving loop of a model, shared by every caller on every thread.

Callers ``submit`` validated requests (any thread, never waiting for a step) and wait on their
handles. Whoever waits drives: when no thread is advancing the model, a waiting caller becomes the
*driver* and runs scheduler steps on its own thread until its own request is done, then hands the
role on (a single caller never pays a thread hop); every other waiter's request is batched into the
same steps (continuous batching). An ``InferenceEngine`` adds a background driver thread, so
requests advance while nobody waits. At most one thread steps at a time.

Listeners and hooks run on the driver's thread inside a step. From there, ``cancel`` takes effect at
the end of the step, and waiting on an unfinished request raises RuntimeError at once (it would wait
on the very thread that must advance it). ``shutdown`` ends everything pending with
EngineShutdownError and refuses new requests.

At interpreter exit every live serving loop does the same (``release_at_exit``): its background
driver is stopped and joined and every pending request ends with EngineShutdownError, its KV
released, so no thread is inside a forward when the interpreter stops its daemon threads (one
stopped there aborts the process).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import EngineShutdownError, GenerationCancelled
from .request import Request, RequestHandle
from .sample_group import SampleGroup, sample_requests
from .scheduler import Scheduler

if TYPE_CHECKING:
    from .context import ServingContext

T = TypeVar("T")

IDLE_WAIT_S = 0.5  # how long an idle background driver sleeps between checks for work
LOGGER = logging.getLogger(__name__)
EXIT_WAIT_S = 10.0  # at interpreter exit: the longest wait for the current step to end

# every serving loop, for the release at interpreter exit
_LIVE: weakref.WeakSet[ServingLoop] = weakref.WeakSet()


def _release_at_exit() -> None:
    for loop in list(_LIVE):
        try:
            loop.release_at_exit()
        except Exception:  # noqa: BLE001 - one broken loop must not keep the others' threads
                           # running at exit
            pass


atexit.register(_release_at_exit)


class ServingLoop:
    """Queue, driver election and stepping over one ``Scheduler`` (see the module docstring)."""

    def __init__(self, context: ServingContext) -> None:
        self.scheduler = Scheduler(context)
        self.engine_attached = False  # an InferenceEngine drives this loop (at most one per model)
        # held for one scheduler step, or by a caller cancelling between steps
        self._step_lock = threading.RLock()
        self._cv = threading.Condition(threading.Lock())  # driver role, intake, completions
        # submitted, not yet seen by the scheduler (guarded by _cv)
        self._intake: list[RequestHandle] = []
        self._driver: int | None = None  # ident of the thread driving steps
        self._stepping: int | None = None  # ident of the thread inside step()
        self._numbers = itertools.count(1)
        self._closed = False
        # what submit says once closed
        self._closed_reason = "the model is closed; load it again to generate"
        # callers waiting for the step lock: the driver yields to them between steps
        self._cancel_waiters = 0
        # the background driver; one that is replaced stops
        self._thread: threading.Thread | None = None
        self._stop_when_idle = False  # the background driver stops once no request is left
        # run once the current step has ended (see defer)
        self._after_step: list[Callable[[], None]] = []
        self.steps = 0
        _LIVE.add(self)

    # ------------------------------------------------------------------ submission
    def submit(self, request: Request) -> RequestHandle | SampleGroup:
        """Queue ``request``; returns its handle at once (never waits for a step): a
        ``RequestHandle``, or for ``n > 1`` samples a ``SampleGroup`` of their handles, queued
        together. EngineShutdownError after ``shutdown``."""
        with self._cv:
            if self._closed:
                raise EngineShutdownError(self._closed_reason)
            handles = [RequestHandle(next(self._numbers), r, self)
                       for r in sample_requests(request)]
            self._intake.extend(handles)
            self._cv.notify_all()
        return handles[0] if request.params.n == 1 else SampleGroup(request, handles)

    @property
    def num_waiting(self) -> int:
        """Requests queued and not yet bound into the pool."""
        with self._cv:
            return len(self._intake) + len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        """Requests bound into the pool (running or preempted)."""
        return len(self.scheduler.running) + len(self.scheduler.preempted)

    # ------------------------------------------------------------------ stepping
    def step(self) -> bool:
        """One scheduling step on the calling thread; False when there was nothing to run.
        RuntimeError from a listener (a step inside a step)."""
        me = threading.get_ident()
        if self._stepping == me:
            raise RuntimeError("step() called from a listener or hook inside a step; "
                               "return from it instead")
        with self._step_lock:
            self._stepping = me
            ended = self.scheduler.ended
            try:
                with self._cv:
                    self.scheduler.waiting.extend(self._intake)
                    self._intake.clear()
                try:
                    worked = self.scheduler.step()
                except Exception as exc:
                    # not a request's error (those are isolated): fail every request
                    self.scheduler.fail_all(exc)
                    worked = True
                if worked:
                    self.steps += 1
            finally:
                self._stepping = None
                after, self._after_step = self._after_step, []
                for fn in after:
                    try:
                        fn()
                    except Exception:  # noqa: BLE001 - one deferred call must not skip the
                        # others (a stream waiting on its publication) or stop the driving thread
                        LOGGER.exception("a call deferred to the end of a step failed")
        if self.scheduler.ended != ended:
            with self._cv:
                self._cv.notify_all()  # waiters whose request ended
        if self._cancel_waiters:
            # let a caller waiting to cancel take the step lock (locks are not fair)
            time.sleep(0.0005)
        return worked

    def in_step(self) -> bool:
        """Whether the calling thread is inside a step (a listener or hook is running)."""
        return self._stepping == threading.get_ident()

    def defer(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current step has ended (call from inside a step only); what it
        raises is logged, and the other deferred calls still run."""
        self._after_step.append(fn)

    def _has_work(self) -> bool:
        return bool(self._intake) or self.scheduler.has_work()

    def wait(self, handle: RequestHandle, timeout: float | None = None) -> None:
        """Return once ``handle`` is done, driving steps on this thread while no other thread does.
        TimeoutError after ``timeout`` seconds; RuntimeError when called from a listener for a
        request that is not done."""
        if handle.done():
            return
        me = threading.get_ident()
        if self._stepping == me or self._driver == me:
            raise RuntimeError(f"waiting on request {handle.request_number} from a listener or "
                               "hook of a running request would stop every request: "
                               "wait outside the callback")
        deadline = None if timeout is None else time.monotonic() + timeout
        while not handle.done():
            with self._cv:
                while not handle.done() and self._driver is not None:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cv.wait(left)
                if handle.done():
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"request {handle.request_number} not done "
                                       f"within {timeout} s")
                self._driver = me
            try:
                while not handle.done() and (deadline is None or time.monotonic() < deadline):
                    if not self.step() and not handle.done():
                        # nothing runnable yet (only possible while another thread cancels)
                        with self._cv:
                            self._cv.wait(0.001)
            finally:
                with self._cv:
                    self._driver = None
                    self._cv.notify_all()

    # ------------------------------------------------------------------ cancellation
    def cancel(self, handle: RequestHandle) -> bool:
        """Cancel ``handle``'s request; False if it was already done. From the driver's thread (a
        listener) the cancellation takes effect at the end of the step; from any other thread the
        request's pages are released before this returns."""
        if handle.done():
            return False
        if self._stepping == threading.get_ident():
            handle.cancel_requested = True
            return True
        with self._cv:
            queued = handle in self._intake
            if queued:
                self._intake.remove(handle)
        if queued:  # settled outside the lock: done callbacks run on this thread
            handle._set_error(GenerationCancelled(f"request {handle.request_number} was cancelled"))
            with self._cv:
                self._cv.notify_all()
            return True
        with self._between_steps():
            if handle.done():
                return False
            # moved from the intake by a step meanwhile, and already finished
            if not self.scheduler.holds(handle):
                return False
            self.scheduler.cancel(handle)
        with self._cv:
            self._cv.notify_all()
        return True

    def _between_steps(self) -> _StepLock:
        return _StepLock(self)

    def run_between_steps(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn`` on the calling thread between two scheduler steps and return its result: the
        step lock is held while it runs (a driver yields it to a waiting caller between steps), so
        no step of this loop interleaves with ``fn`` (a forward over the model's pool outside the
        scheduler, for example). TimeoutError when the lock is not had within ``timeout`` s (None:
        as long as it takes); RuntimeError from inside a step (a listener or hook), where ``fn``
        would run in the middle of it. Nested calls on one thread run at once."""
        if self.in_step():
            raise RuntimeError("run_between_steps called from a listener or hook inside a step; "
                               "call it outside the callback")
        lock = _StepLock(self, timeout)
        with lock:
            if not lock.acquired:
                raise TimeoutError(f"the serving loop's step lock was not free within {timeout} s")
            return fn()

    # ---------------------------------------------------------- background driver (InferenceEngine)
    def start_thread(self) -> None:
        """Start a background driver thread that advances requests while nobody waits, until
        ``stop_thread`` (idempotent; a driver started by ``serve_until_idle`` stays on)."""
        with self._cv:
            self._stop_when_idle = False
            if self._thread is None or not self._thread.is_alive():
                self._start_thread_locked()

    def serve_until_idle(self) -> None:
        """Make sure queued requests advance without a waiting caller: start a background driver
        that stops once no request is left, unless a driver thread already runs (an engine's, or an
        earlier one's). Nothing after ``shutdown``. Cheap and idempotent: a caller that waits for a
        request nobody else waits on may call it again at any time (a stream does, while no chunk
        comes)."""
        with self._cv:
            if self._closed:
                return
            if self._thread is None or not self._thread.is_alive():
                self._start_thread_locked()
                self._stop_when_idle = True

    def drive_here(self) -> None:
        """Be the background driver on the calling thread until ``stop_thread`` (from another
        thread) or ``shutdown``: requests advance while nobody waits, as with ``start_thread``, on
        this thread. For a process whose main thread has nothing else to do (``smile-llm serve``):
        on the CPU, torch's intra-op threads serve the main thread best (a forward on another
        thread measured up to 2x slower with 2 OpenMP threads)."""
        me = threading.current_thread()
        with self._cv:
            self._stop_when_idle = False
            self._thread = me
        self._serve()

    def _start_thread_locked(self) -> None:
        thread = threading.Thread(target=self._serve, name="smile-llm-serving-loop", daemon=True)
        self._thread = thread  # before start: the thread serves while it is the current one
        thread.start()

    def stop_thread(self, wait: bool = True, when_idle: bool = False) -> None:
        """Stop the background driver after its current step (``when_idle``: once no request is
        left); ``wait`` joins it unless called from it. Requests left pending stay queued: a waiting
        caller drives them, or ``serve_until_idle`` starts a driver that finishes them."""
        with self._cv:
            thread = self._thread
            if when_idle:
                self._stop_when_idle = True
            else:
                # the thread sees it is no longer the current driver and returns
                self._thread = None
            self._cv.notify_all()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def thread_alive(self) -> bool:
        """Whether a background driver thread is running (one being stopped no longer counts)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def closed(self) -> bool:
        """Whether the loop has shut down (its model was closed)."""
        return self._closed

    def has_work(self) -> bool:
        """Whether any request is queued, running or preempted."""
        with self._cv:
            return self._has_work()

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                while self._thread is me and (self._driver is not None or not self._has_work()):
                    if self._stop_when_idle and not self._has_work():
                        self._thread = None
                        break
                    self._cv.wait(IDLE_WAIT_S)
                if self._thread is not me:
                    return
                self._driver = me.ident
            # step() fails the requests of any error inside it, so nothing but an interrupt ends
            # this loop
            try:
                while self._thread is me and self._has_work():
                    if not self.step():
                        with self._cv:
                            self._cv.wait(0.001)
            finally:  # a waiting caller takes over if this thread ends
                with self._cv:
                    self._driver = None
                    self._cv.notify_all()

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Refuse new requests and end every pending one with EngineShutdownError (KV released),
        then stop the background driver. From a listener, the requests still pending when the
        current step ends fail then (a request the step completes keeps its result)."""
        self._end_everything("the model was closed")
        self.stop_thread(wait=True)
        with self._cv:
            self._cv.notify_all()

    def release_at_exit(self, timeout: float = EXIT_WAIT_S) -> None:
        """What interpreter exit runs for every live serving loop: refuse new requests, stop the
        background driver (joined for at most ``timeout`` s) and end every pending request with
        EngineShutdownError, its KV released, once the current step has ended (waiting at most
        ``timeout`` s for it). Afterwards no thread of this loop is inside a forward, so the
        interpreter can stop its daemon threads without aborting. Idempotent."""
        with self._cv:
            if not self._closed:
                self._closed, self._closed_reason = True, "the interpreter is exiting"
            thread, self._thread = self._thread, None
            self._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._end_everything("the interpreter is exiting", timeout)

    def _end_everything(self, reason: str, timeout: float | None = None) -> None:
        """Refuse new requests and end every pending one with EngineShutdownError(``reason``):
        queued ones at once, bound ones between steps (from a listener: once the current step has
        ended; otherwise waiting at most ``timeout`` s for the step lock, None: as long as it
        takes)."""
        with self._cv:
            self._closed = True
            intake, self._intake = self._intake, []
        for handle in intake:
            handle._set_error(EngineShutdownError(f"request {handle.request_number}: {reason}"))

        def end_jobs() -> None:
            try:
                for handle in self.scheduler.handles():
                    self.scheduler.end(handle, error=EngineShutdownError(
                        f"request {handle.request_number}: {reason}"))
            except Exception:  # noqa: BLE001 - a broken pool: every handle still ends (their KV
                               # evicted)
                self.scheduler.fail_all(EngineShutdownError(reason))

        if self._stepping == threading.get_ident():
            # after the step: ended with the documented error, not as cancelled
            self.defer(end_jobs)
            return
        lock = _StepLock(self, timeout)
        with lock:
            if lock.acquired:
                end_jobs()
        with self._cv:
            self._cv.notify_all()


class _StepLock:
    """The step lock for a caller thread; the driver yields it between steps while a caller waits
    for it. With a ``timeout``, ``acquired`` says whether it was taken in time (the body must check
    it)."""

    def __init__(self, loop: ServingLoop, timeout: float | None = None) -> None:
        self.loop = loop
        self.timeout = timeout
        self.acquired = False

    def __enter__(self) -> None:
        with self.loop._cv:
            self.loop._cancel_waiters += 1
        self.acquired = self.loop._step_lock.acquire(timeout=-1 if self.timeout is None
                                                     else self.timeout)

    def __exit__(self, *exc: object) -> None:
        if self.acquired:
            self.loop._step_lock.release()
            self.acquired = False
        with self.loop._cv:
            self.loop._cancel_waiters -= 1
