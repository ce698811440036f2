"""`mosafs bench series|stripe|clients` without --json (issue 16): a table for people, not
a JSON document of every step. Small runs on loopback: a real testbed and real writers."""

from __future__ import annotations

import pytest

from tests.harness import cli

RUNS = {
    "series": (["--configs", "non-CA fixed 1024K,CA-CPU cdc 1024K", "--size-mib", "2",
                "--steps", "2", "--workload", "similar"],
               ["configuration", "chunker", "step 1 ASB", "later ASB", "similarity"],
               ["non-CA fixed 1024K", "CA-CPU cdc 1024K"]),
    "stripe": (["--widths", "1,2", "--size-mib", "2"],
               ["stripe width", "OAB", "ASB", "errors"], ["1", "2"]),
    "clients": (["--writers", "1", "--size-mib", "2"],
                ["writers", "aggregate", "per writer ASB", "manager tx/s"], ["1"]),
}


@pytest.mark.parametrize("benchmark", RUNS)
def test_cluster_bench_prints_a_table_without_json(benchmark: str) -> None:
    args, headers, firsts = RUNS[benchmark]
    done = cli("bench", benchmark, "--quick", "--links", "none", *args, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"mosafs bench {benchmark}: ") and "loopback" in lines[0]
    assert all(h in lines[2] for h in headers), lines[2]
    rows = lines[3:3 + len(firsts)]
    assert [row[:len(first)] for row, first in zip(rows, firsts, strict=True)] == firsts
    assert all(row.split()[-1] == "0" for row in rows), rows  # no errors
    assert lines[-1].startswith("MB/s = 10^6 bytes/s; --json prints every figure")
    assert "{" not in done.stdout and len(done.stdout) < 2000, done.stdout
