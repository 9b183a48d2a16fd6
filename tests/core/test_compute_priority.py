"""Compute threads at a lower priority than the event loop (headroom.core.compute_priority), thread by thread."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from headroom.core.compute_priority import MAX_NICE, check_nice, lower_current_thread, run_lowered

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _my_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _in_thread(fn: object) -> list[object]:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(fn()))  # type: ignore[operator]
    thread.start()
    thread.join()
    return out


@linux_only
def test_lower_current_thread_lowers_only_that_thread() -> None:
    before = _my_nice()
    seen = _in_thread(lambda: (lower_current_thread(7), _my_nice()))
    assert seen == [(True, max(7, before))]
    assert _my_nice() == before  # the caller's thread keeps its priority


@linux_only
def test_zero_is_a_no_op_and_a_higher_current_value_is_kept() -> None:
    assert _in_thread(lambda: (lower_current_thread(0), _my_nice())) == [(False, _my_nice())]
    seen = _in_thread(lambda: (lower_current_thread(12), lower_current_thread(5), _my_nice()))
    assert seen == [(True, True, max(12, _my_nice()))]  # never raised back (it could not be, unprivileged)


@linux_only
def test_run_lowered_runs_in_a_lowered_thread_whose_children_inherit_it() -> None:
    caller = _my_nice()

    def body() -> tuple[int, list[object]]:
        return _my_nice(), _in_thread(_my_nice)  # a pool thread created here, as a runtime's would be

    own, children = run_lowered(body, 9, "t")
    assert own == max(9, caller) and children == [max(9, caller)]
    assert _my_nice() == caller


def test_run_lowered_returns_and_reraises() -> None:
    assert run_lowered(lambda: 41 + 1, 5) == 42
    with pytest.raises(KeyError, match="boom"):
        run_lowered(lambda: {}["boom"], 5)


@pytest.mark.parametrize("value", [0, 1, 10, MAX_NICE])
def test_check_nice_accepts_the_range(value: int) -> None:
    assert check_nice(value, "runtime.compute_nice") == value


@pytest.mark.parametrize("value", [-20, -1, MAX_NICE + 1, 40, 2**63, True, 1.5, "10", None])
def test_check_nice_refuses_the_rest_naming_the_key(value: object) -> None:
    with pytest.raises(ValueError, match=r"runtime\.compute_nice: expected an integer from 0"):
        check_nice(value, "runtime.compute_nice")
