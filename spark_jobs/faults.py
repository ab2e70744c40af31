"""Fault injection for crash tests: a process killed, or an exception raised, right
after a named write, and a trace of the writes that committed."""

from __future__ import annotations

import os
import signal
import time

CRASH_AFTER_VARIABLE = "TIDEMARK_CRASH_AFTER"


CRASH_BY_VARIABLE = "TIDEMARK_CRASH_BY"


TRACE_WRITES_VARIABLE = "TIDEMARK_TRACE_WRITES"


class InjectedCrash(RuntimeError):
    """A crash point reached with ``TIDEMARK_CRASH_BY=raise``."""


# The crash points that raised in this process, in order, so a test can tell its
# injected crash from any other failure of the job it crashed.
INJECTED_CRASHES: list[str] = []


def crash_point(step: str) -> None:
    """Fault injection for crash tests, right after a write: with
    ``TIDEMARK_CRASH_AFTER=<step>`` this process dies by SIGKILL here, as a kill -9
    would leave it. With ``TIDEMARK_CRASH_BY=raise`` as well, the step raises
    :class:`InjectedCrash` instead, so tests can crash a job run in their own session:
    the tables and the checkpoint are left as a kill leaves them (what committed stays,
    the micro-batch is replayed).

    With ``TIDEMARK_TRACE_WRITES=<file>`` every write that committed is appended to
    the file as it happens, so a test that kills the process can tell where the
    kill landed."""
    trace = os.environ.get(TRACE_WRITES_VARIABLE)
    if trace:
        with open(trace, "a") as written:
            written.write(f"{time.time():.3f} {step}\n")
    if os.environ.get(CRASH_AFTER_VARIABLE) != step:
        return
    if os.environ.get(CRASH_BY_VARIABLE) == "raise":
        INJECTED_CRASHES.append(step)
        raise InjectedCrash(step)
    os.kill(os.getpid(), signal.SIGKILL)
