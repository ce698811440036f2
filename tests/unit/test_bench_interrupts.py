"""A benchmark run stops at Ctrl-C, SIGTERM or SIGHUP and cleans up (mosafs.bench.write):
a signal whose KeyboardInterrupt was swallowed where it was raised (Python raises it
wherever the main thread is, and a callback that ignores exceptions, such as an import's
module-lock callback, drops it) is raised again at the run's next step; a signal that
comes while processes are being stopped waits for the end of the stop."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from mosafs.bench import write


def _deliver(signum: int) -> None:
    """SIGNUM sent to this process; its handler runs before os.kill returns (main thread)."""
    os.kill(os.getpid(), signum)


def test_a_lost_interrupt_is_raised_again_at_the_next_step() -> None:
    with write._signals_interrupt():
        write.progress("before")  # nothing pending: prints
        with contextlib.suppress(KeyboardInterrupt):  # as a callback ignoring exceptions
            _deliver(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt, match="raised again"):
            write.progress("the next step")
    write.progress("after the run")  # the run is over: nothing pending


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_the_run_like_ctrl_c(signum: int) -> None:
    with write._signals_interrupt(), pytest.raises(KeyboardInterrupt):
        _deliver(signum)
    assert signal.getsignal(signum) is not write._interrupt  # put back at the end


def test_a_signal_while_stopping_waits_for_the_stop_to_end() -> None:
    stopped = []
    with write._signals_interrupt():
        with pytest.raises(KeyboardInterrupt, match="held off"), write._uninterrupted():
            _deliver(signal.SIGINT)
            write.progress("still stopping")  # held: no second interrupt here
            stopped.append(True)
        assert stopped == [True]
