"""Lockstep with a peer process, step by step: bench/cpu_lockstep.py's protocol, the Python side
(bench/cpu_step.cpp's Turns is the C++ one).

Before each step, one byte is read from the turn-in FIFO (blocking until the peer's step has
ended), then the process sleeps settle_ms (the peer's OpenMP threads stop spinning and sleep, so
they take no core from this step); after the step, one byte is written to the turn-out FIFO.
Both FIFOs are opened read-write, which on Linux never blocks and keeps a reader on each, so
neither side's open or last write waits for the other. The driver hands out the first turn and
kills a side whose peer died (a read here would wait forever).
"""

import os
import time


def monotonic_ms():
    """CLOCK_MONOTONIC in ms, the clock cpu_step's spans use (libstdc++'s steady_clock)."""
    return time.monotonic() * 1e3


class Turns:
    def __init__(self, turn_in, turn_out, settle_ms):
        self._in = _open_fifo(turn_in, "--turn-in")
        self._out = _open_fifo(turn_out, "--turn-out")
        self._settle_s = settle_ms / 1e3

    def wait_for_turn(self):
        if os.read(self._in, 1) != b"t":
            raise RuntimeError("--turn-in: the peer's FIFO ended or sent something else")
        time.sleep(self._settle_s)

    def pass_turn(self):
        os.write(self._out, b"t")

    def close(self):
        os.close(self._in)
        os.close(self._out)


def _open_fifo(path, flag):
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise SystemExit(f"{flag} '{path}': {e.strerror} (a FIFO made with mkfifo)")
