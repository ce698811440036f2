"""The rebuild benchmark's arithmetic (mosafs.bench.ec_rebuild): the comparison of the
6-survivor case with the 2-survivor one is by rate, since random placement gives the dead
benefactor its share only on average."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from mosafs.bench import ec_rebuild


def _case(name: str, rebuilt: int, seconds: float) -> dict:  # type: ignore[type-arg]
    return {"case": name, "rebuilt_bytes": rebuilt, "rebuild_s": seconds,
            "rebuild_mb_s": round(rebuilt / seconds / 1e6, 1)}


def test_comparisons_are_by_rate_against_the_3x_target() -> None:
    two, six = ec_rebuild.CASES[0].name, ec_rebuild.CASES[1].name
    out = ec_rebuild.comparisons([_case(two, 60_000_000, 20.0), _case(six, 70_000_000, 7.0)])
    assert out == {"ec:1+1": {"two": two, "six": six, "speedup": 3.33, "target": 3.0,
                              "pass": True}}
    slow = ec_rebuild.comparisons([_case(two, 60_000_000, 20.0), _case(six, 60_000_000, 10.0)])
    assert slow["ec:1+1"]["speedup"] == 2.0 and not slow["ec:1+1"]["pass"]
    assert ec_rebuild.comparisons([_case(two, 1, 1.0)]) == {}


def test_every_comparison_pairs_one_code() -> None:
    names = {c.name: c for c in ec_rebuild.CASES}
    for code, two, six in ec_rebuild.COMPARISONS:
        assert names[two].redundancy == names[six].redundancy == code
        assert (names[two].survivors, names[six].survivors) == (2, 6)
        # Full redundancy must fit on the benefactors left (the replacement counts).
        for case in (names[two], names[six]):
            k, m = ec_rebuild._code(case.redundancy)
            assert k + m <= case.survivors + case.replacement


def test_link_use_is_measured_over_the_steady_middle() -> None:
    # 2.5 MB/s links; the rebuilt bytes reach 10 % at t=1 and 90 % at t=9.
    timeline = [(0.0, 0), (1.0, 10), (5.0, 50), (9.0, 90), (10.0, 100)]
    rate_bit = 20_000_000
    full, half = 2_500_000, 1_250_000
    # Link "1" sends at full speed and receives at half; link "2" sends nothing from t=3.
    traffic = [(t / 4, {"1": [int(full * t / 4), int(half * t / 4)],
                        "2": [int(full * min(t / 4, 3.0)), 0]}) for t in range(41)]
    out = ec_rebuild.link_use(timeline, traffic, rate_bit)
    assert out is not None
    assert out["1"] == {"out_use": 1.0, "in_use": 0.5, "out_idle": 0.0, "in_idle": 0.0}
    assert out["2"]["out_use"] == 0.25  # 2 s of 8 at full speed
    assert out["2"]["out_idle"] == 0.75 and out["2"]["in_idle"] == 1.0
    assert ec_rebuild.link_use(timeline, [], rate_bit) is None  # no netns links


def test_wire_use_is_the_token_buckets_count_over_the_steady_middle() -> None:
    timeline = [(0.0, 0), (1.0, 10), (5.0, 50), (9.0, 90), (10.0, 100)]
    rate_bit = 20_000_000
    # Link "1" takes its whole bucket, link "2" a fifth; a sample tc could not read ({})
    # is skipped.
    wire = [(t / 4, {"1": int(2_500_000 * t / 4), "2": int(500_000 * t / 4)})
            for t in range(41)]
    wire[20] = (5.0, {})
    assert ec_rebuild.wire_use(timeline, wire, rate_bit) == {"1": 1.0, "2": 0.2}
    assert ec_rebuild.wire_use(timeline, [], rate_bit) is None
    assert ec_rebuild.wire_use([(0.0, 0)], wire, rate_bit) is None  # nothing rebuilt


def test_tc_counts_are_read_per_link_from_the_client_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What `tc -s -j qdisc show` prints in the client namespace: the links' client ends
    # (mbNcI) with their tbf, and other devices and qdiscs, which are not links.
    shown = json.dumps([
        {"kind": "noqueue", "dev": "lo", "bytes": 5},
        {"kind": "tbf", "dev": "mb7c1", "bytes": 1000},
        {"kind": "tbf", "dev": "mb7c12", "bytes": 2000},
        {"kind": "pfifo_fast", "dev": "mb7c3", "bytes": 3000},
        {"kind": "tbf", "dev": "eth0", "bytes": 4000},
    ])
    ran: list[list[str]] = []

    def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append(args)
        return subprocess.CompletedProcess(args, 0, stdout=shown, stderr="")

    monkeypatch.setattr(ec_rebuild.subprocess, "run", run)
    assert ec_rebuild._read_wire() == {"1": 1000, "12": 2000}
    assert ran == [["tc", "-s", "-j", "qdisc", "show"]]
    # An old tc without JSON, or none at all: no counts, and the benchmark goes on.
    monkeypatch.setattr(ec_rebuild.subprocess, "run",
                        lambda args, **kw: subprocess.CompletedProcess(args, 0, "qdisc tbf", ""))
    assert ec_rebuild._read_wire() == {}

    def missing(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("tc")

    monkeypatch.setattr(ec_rebuild.subprocess, "run", missing)
    assert ec_rebuild._read_wire() == {}


def test_cases_are_picked_by_number() -> None:
    assert ec_rebuild._pick("") == ec_rebuild.CASES
    assert ec_rebuild._pick("2,1") == (ec_rebuild.CASES[1], ec_rebuild.CASES[0])
    for bad in ("0", "5", "x", "1,,2"):
        try:
            ec_rebuild._pick(bad)
        except ValueError as exc:
            assert "case number" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")
