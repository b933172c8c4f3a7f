"""Sections of code that Ctrl-C does not cut short.

Python raises KeyboardInterrupt in the main thread at whichever bytecode next checks for signals
(a function starting, a call returning, a loop's jump back), so code that must run to its end once
begun (replacing library functions while a trace runs and putting them back, `substitutes`) could
be left half done. `guarded` enters such sections, runs a call and leaves them with a SIGINT
handler of its own in place: a signal that arrives while the sections are entered or left is
noted, and passed on to the handler it stands in for once they are; one that arrives during the
call is passed on at once. Between the call's return and the start of leaving, `guarded` only
stores a number, which checks for nothing, so no signal lands there. Python runs signal handlers
in the main thread alone, and only a handler written in Python raises, so elsewhere (or with the
signal ignored) the sections simply run.
"""
from __future__ import annotations

import signal
import threading


class _State(threading.local):
    """What `guarded` keeps per thread; the handler only ever runs in, and reads, the main thread's."""
    critical = 0        # how many calls of `guarded` are entering or leaving their sections
    replaced = None     # the SIGINT handler ours stands in for
    deferred = False    # whether a SIGINT arrived while critical and is yet to be passed on
    frame = None        # the frame it arrived in


_state = _State()


def _defer_or_pass_on(signum, frame):
    if _state.critical:
        _state.deferred, _state.frame = True, frame
    else:
        _state.replaced(signum, frame)


def guarded(call, sections):
    """``call()`` after entering ``sections`` (objects with ``enter()`` and ``leave()``) in order;
    whatever ``call`` raises, the sections entered are left, in reverse. Ctrl-C waits while they
    are entered or left. A section's ``enter`` that raises must leave nothing of itself behind."""
    outer = _state.critical
    _state.critical = outer + 1
    installed, entered = False, []
    try:
        installed = _install()
        for section in sections:
            section.enter()
            entered.append(section)
        _state.critical = outer
        _pass_on_deferred()
        return call()
    finally:
        _state.critical = outer + 1
        for section in reversed(entered):
            section.leave()
        _uninstall(installed, outer)
        _pass_on_deferred()


def _install() -> bool:
    """Put our handler in place of the main thread's SIGINT handler, if that one is Python's or the
    user's (not an outer call's, nor ignoring the signal or ending the process); whether it did."""
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGINT)
    if current is _defer_or_pass_on:
        return False
    _state.deferred = False   # one left by a call that a second signal cut short
    if not callable(current):
        return False
    _state.replaced = current
    signal.signal(signal.SIGINT, _defer_or_pass_on)
    return True


def _uninstall(installed: bool, outer: int) -> None:
    """Put back the handler ours stood in for (if ``installed``), then end the critical section."""
    try:
        if installed and signal.getsignal(signal.SIGINT) is _defer_or_pass_on:
            signal.signal(signal.SIGINT, _state.replaced)
    except BaseException:   # a signal just after the handler came back: the deferred one goes with it
        _state.deferred = False
        raise
    finally:
        _state.critical = outer


def _pass_on_deferred() -> None:
    if _state.deferred:
        frame, _state.frame, _state.deferred = _state.frame, None, False
        _state.replaced(signal.SIGINT, frame)
