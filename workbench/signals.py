"""How a run stops on a signal: Ctrl-C (SIGINT) and SIGTERM stop it between samples, never
inside a write.

The CLI turns SIGTERM into `Terminated` (a KeyboardInterrupt) for the whole command
(`stop_on_sigterm`); the runner holds both signals while a sample is written
(`signals_deferred`). The POSIX convention holds for both: a process started with a signal
ignored keeps ignoring it, as a background job (`cmd &`) ignores SIGINT, and as CPython itself
then installs no KeyboardInterrupt handler (signal module docs, "Python installs a small number
of signal handlers by default").
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any, Iterator


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    from .errors import Terminated

    raise Terminated()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def stop_on_sigterm() -> Any:
    """SIGTERM stops a run as Ctrl-C does (`Terminated`), unless the process was started with
    it ignored. Returns the previous handler to restore (`restore_sigterm`), None if none was set."""
    if not _main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a sample is written: one arriving meanwhile takes effect
    right after the write commits, so an interrupt never cuts a write (the store's commit
    protocol would repair it, but a clean stop needs no repair). Main thread only. A signal
    that was ignored when the write began is left ignored."""
    if not _main_thread():
        yield
        return
    received: list[int] = []
    # a signal the process was started ignoring stays ignored (POSIX: a background job's SIGINT)
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if received:
            signal.raise_signal(received[0])


def signal_drill(written: int) -> None:
    """Interrupt drills: `WORKBENCH_SIGNAL_AT=<SIGINT|SIGTERM>:<n>` sends this process that signal
    while the n-th sample of this run is being written (tests check the write completes and the
    run stops cleanly). Unset, it costs one lookup."""
    target = os.environ.get("WORKBENCH_SIGNAL_AT")
    if target:
        name, _, count = target.partition(":")
        if written + 1 == int(count):
            os.kill(os.getpid(), getattr(signal, name))
