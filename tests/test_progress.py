"""components.common.progress: rate-limited progress lines, with an injected clock."""

from __future__ import annotations

import threading
import time

from components.common.progress import Progress, format_bytes, format_seconds, tree_bytes


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(total: int, unit: str = "rows", **kwargs) -> tuple[Progress, Clock, list[str]]:
    clock, lines = Clock(), []
    return Progress("evaluate: tuned model", total, unit, clock=clock, emit=lines.append, **kwargs), clock, lines


def test_start_line_then_nothing_before_30_s_even_past_5_percent():
    p, clock, lines = make(100)
    assert lines == ["evaluate: tuned model: 0 / 100 rows (0 %)"]
    for _ in range(50):  # half the work in 29 s: still one line
        clock.t += 29 / 50
        p.update()
    assert len(lines) == 1


def test_nothing_before_5_percent_even_after_30_s():
    p, clock, lines = make(1000)
    clock.t += 600
    p.update(49)  # 4.9 % in ten minutes
    assert len(lines) == 1
    p.update(1)
    assert lines[-1] == "evaluate: tuned model: 50 / 1000 rows (5 %), 0.0833 rows/s, ETA 3 h 10 min"


def test_one_line_per_5_percent_or_30_s_whichever_comes_later():
    p, clock, lines = make(100)
    for _ in range(100):  # one row a second: 5 % every 5 s, so the 30 s rule decides
        clock.t += 1
        p.update()
    p.finish()
    # start, at 30 / 60 / 90 s, end
    assert len(lines) == 5
    assert lines[1] == "evaluate: tuned model: 30 / 100 rows (30 %), 1 rows/s, ETA 1 min 10 s"
    assert lines[-1] == "evaluate: tuned model: 100 / 100 rows (100 %), 1 rows/s, done in 1 min 40 s"

    p, clock, lines = make(100)
    for _ in range(100):  # a row every 10 s: 30 s pass within 5 %, so the 5 % rule decides
        clock.t += 10
        p.update()
    p.finish()
    assert len(lines) == 1 + 19 + 1  # start, every 5 % up to 95 %, end


def test_bytes_lines_have_sizes_and_rate():
    p, clock, lines = make(8_000_000_000, unit="bytes")
    clock.t += 40
    p.update(1_200_000_000)
    assert lines[-1] == "evaluate: tuned model: 1.2 GB / 8.0 GB (15 %), 30.0 MB/s, ETA 3 min 47 s"


def test_unknown_total_follows_the_time_rule_only():
    p, clock, lines = make(0, unit="files")
    for _ in range(10):
        clock.t += 10
        p.update()
    assert lines == [
        "evaluate: tuned model: 0 files",
        "evaluate: tuned model: 3 files, 0.1 files/s",
        "evaluate: tuned model: 6 files, 0.1 files/s",
        "evaluate: tuned model: 9 files, 0.1 files/s",
    ]


def test_finish_once_disabled_silent_and_error_exit_has_no_end_line():
    p, clock, lines = make(10)
    p.update(10)
    p.finish()
    p.finish()
    assert len(lines) == 2 and "done in" in lines[-1]
    silent, _, quiet = make(10, enabled=False)
    silent.update(10)
    silent.finish()
    assert quiet == []
    p, _, lines = make(10)
    try:
        with p:
            p.update(3)
            raise KeyError("x")
    except KeyError:
        pass
    assert len(lines) == 1


def test_set_takes_a_measured_total_and_never_goes_back():
    p, clock, lines = make(1000, unit="bytes")
    clock.t += 40
    p.set(300)
    assert p.done == 300 and lines[-1] == "evaluate: tuned model: 300 B / 1.0 kB (30 %), 8 B/s, ETA 1 min 33 s"
    clock.t += 40
    p.set(200)  # a partial file renamed away between two looks
    assert p.done == 300 and len(lines) == 2
    p.update(100)
    assert p.done == 400


def test_watching_sets_what_the_measure_returns_while_the_block_runs(tmp_path):
    p, _, _ = make(500, unit="bytes")
    looks = []

    def measure() -> int:
        looks.append(1)
        if len(looks) == 2:
            raise FileNotFoundError("renamed while measured")  # skipped, the next look counts
        return tree_bytes(tmp_path)

    with p.watching(measure, every_s=0.01):
        (tmp_path / "a.part").write_bytes(b"x" * 300)
        deadline = time.monotonic() + 5
        while p.done < 300 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.done == 300
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "b").write_bytes(b"x" * 400)  # more than the total: capped
        while p.done < 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p.done == 500
    after = len(looks)
    time.sleep(0.05)
    assert len(looks) == after  # the watcher stopped with the block
    assert tree_bytes(tmp_path / "missing") == 0
    silent, _, _ = make(10, enabled=False)
    with silent.watching(lambda: 1 / 0):  # disabled: nothing is watched
        pass


def test_update_from_threads_counts_every_unit():
    p, _, _ = make(8000)
    threads = [threading.Thread(target=lambda: [p.update() for _ in range(1000)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.done == 8000


def test_formatting():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1_500) == "1.5 kB"
    assert format_bytes(2_000_000_000_000) == "2.0 TB"
    assert format_seconds(7.4) == "7 s"
    assert format_seconds(141) == "2 min 21 s"
    assert format_seconds(3 * 3600 + 5 * 60) == "3 h 05 min"
