"""`mosafs bench hash` on a machine without a GPU: the CPU and oracle figures, the clear
error for `--backend gpu`, the parser's wiring and lightness, targets and the summary.

Unit level: the tests call mosafs.bench.hash in this process. The `test_cli_*` tests run
`python -m mosafs bench hash` as a subprocess (what a user types), with --quick sizes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mosafs.bench import hash as hash_bench
from mosafs.chunking.gpu import probe_gpu
from mosafs.cli import build_parser
from mosafs.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = probe_gpu()


def mosafs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mosafs", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def one_json_object(stdout: str) -> dict[str, Any]:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout  # --json: only the object, on one line
    result = json.loads(lines[0])
    assert isinstance(result, dict)
    return result


# --- the command line (subprocess) --------------------------------------------------------

def test_cli_cpu_quick_json_prints_one_object_with_the_cpu_figures() -> None:
    proc = mosafs("bench", "hash", "--backend", "cpu", "--quick", "--json")
    assert proc.returncode == 0, proc.stderr
    result = one_json_object(proc.stdout)
    assert result["benchmark"] == "hash"
    assert result["quick"] is True
    cpu = result["cpu"]
    assert cpu["cores"] >= 1
    for name in ("one_core_GBps", "all_cores_one_stream_GBps", "all_cores_streams_GBps"):
        assert cpu[name] > 0, name
    assert "gpu" not in result and "oracle" not in result


def test_cli_oracle_quick_json() -> None:
    proc = mosafs("bench", "hash", "--backend", "oracle", "--quick", "--json")
    assert proc.returncode == 0, proc.stderr
    result = one_json_object(proc.stdout)
    assert result["oracle"]["stream_GBps"] > 0
    assert result["oracle"]["bytes"] > 0
    assert "cpu" not in result and "gpu" not in result


@pytest.mark.skipif(NO_GPU is None, reason="this host has a usable GPU")
def test_cli_gpu_without_a_gpu_fails_with_one_line_naming_cupy() -> None:
    proc = mosafs("bench", "hash", "--backend", "gpu", "--quick", "--json")
    assert proc.returncode == ConfigError.exit_code != 0
    assert proc.stdout == ""  # nothing measured, not even the CPU
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mosafs bench hash: GPU hash backend requested but ")
    assert "CuPy" in lines[0]


def test_cli_bad_size_is_a_one_line_error() -> None:
    proc = mosafs("bench", "hash", "--backend", "cpu", "--cpu-mib", "0")
    assert proc.returncode == ConfigError.exit_code
    assert proc.stderr.strip() == ("mosafs bench hash: argument --cpu-mib: must be "
                                   "1..1048576, got '0' (see mosafs bench hash --help)")


def test_cli_parser_stays_light() -> None:
    """Building the bench parser imports neither numpy nor the chunking package: every
    `mosafs` command builds it."""
    code = ("import argparse, sys\n"
            "from mosafs.bench import cli\n"
            "cli.add_arguments(argparse.ArgumentParser())\n"
            "heavy = sorted(m for m in sys.modules if m == 'numpy' or m.startswith("
            "('mosafs.chunking', 'cupy', 'numba')))\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


# --- in process ---------------------------------------------------------------------------

def test_parser_wires_hash_to_its_run() -> None:
    args = build_parser().parse_args(["bench", "hash", "--backend", "oracle", "--quick",
                                      "--json", "--spec", "fixed:65536"])
    assert args.command == "bench" and args.benchmark == "hash"
    assert args.bench_run is hash_bench.run
    assert (args.backend, args.quick, args.json, args.spec) == ("oracle", True, True,
                                                                 "fixed:65536")
    write = build_parser().parse_args(["bench", "write", "--quick"])
    assert write.bench_run is not hash_bench.run
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "hash", "--backend", "tpu"])


def test_cpu_figures_small() -> None:
    result = hash_bench.run_hash_benchmark("cpu", quick=True, cpu_mib=4, spec="fixed:65536")
    assert result["spec"] == "fixed:65536"
    assert result["cpu"]["bytes"] == 4 << 20
    assert result["cpu"]["one_core_GBps"] > 0
    assert result["targets"] == {}
    assert "one core" in hash_bench.format_summary(result)


def test_gpu_requested_without_one_is_a_config_error_before_any_figure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import mosafs.chunking.gpu as gpu

    monkeypatch.setattr(gpu, "gpu_unavailable_reason", lambda: "CuPy sees no CUDA device")
    monkeypatch.setattr(hash_bench, "cpu_figures", _must_not_run)
    with pytest.raises(ConfigError) as info:
        hash_bench.run_hash_benchmark("gpu", quick=True)
    assert str(info.value) == "GPU hash backend requested but CuPy sees no CUDA device"


def test_auto_and_all_record_why_there_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import mosafs.chunking.gpu as gpu

    monkeypatch.setattr(gpu, "gpu_unavailable_reason", lambda: "CuPy is not installed")
    monkeypatch.setattr(hash_bench, "cpu_figures", lambda *a: {"cores": 1, "one_core_GBps": 1.0,
                                                               "all_cores_streams_GBps": 1.0,
                                                               "all_cores_one_stream_GBps": 1.0})
    monkeypatch.setattr(hash_bench, "oracle_figures", lambda *a: {"stream_GBps": 9.0})
    auto = hash_bench.run_hash_benchmark("auto", quick=True)
    assert auto["gpu"] == {"unavailable": "CuPy is not installed"}
    assert "oracle" not in auto
    everything = hash_bench.run_hash_benchmark("all", quick=True)
    assert set(everything) >= {"cpu", "gpu", "oracle"}
    summary = hash_bench.format_summary(everything)
    assert "gpu: unavailable: CuPy is not installed" in summary
    assert "oracle stream: 9.0" in summary


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        hash_bench.run_hash_benchmark("tpu")
    for option in ("cpu_mib", "gpu_gib", "kernel_mib", "repeat"):
        with pytest.raises(ConfigError, match=">= 1"):
            hash_bench.run_hash_benchmark("cpu", **{option: 0})
    with pytest.raises(ConfigError, match="power of two"):
        hash_bench.run_hash_benchmark("cpu", spec="cdc:1000:3000:9000")


def test_targets_and_summary_of_gpu_figures() -> None:
    """What a GPU run reports (figures of the H100 run in docs/benchmarks.md)."""
    gpu = {
        "devices": ["NVIDIA H100 80GB HBM3"], "device_count": 1,
        "copy": {"per_device": [{"device": 0, "h2d_GBps": 54.96, "d2h_GBps": 54.99}]},
        "kernels": {"GBps": {"candidate_kernel": 1375.3, "hash_kernel": 1030.8,
                             "total": 460.7, "total_pipelined": 632.5}},
        "end_to_end_pinned": {"GBps": 54.18, "median_GBps": 54.05, "over_h2d": 0.986},
        "end_to_end_from_bytes": {"GBps": 6.07},
        "api_chunk_all_with_bytes": {"GBps": 1.0},
    }
    result = {"spec": "cdc:262144:1048576:4194304", "gpu": gpu}
    targets = hash_bench._targets(result)
    assert targets["end_to_end_over_h2d"] == {"value": 0.986, "target": 0.9, "pass": True}
    assert targets["kernels_total_GBps"]["pass"] is False
    assert targets["kernels_total_pipelined_GBps"]["pass"] is True
    result["targets"] = targets
    summary = hash_bench.format_summary(result)
    assert "H2D 54.96" in summary
    assert "from pinned: median 54.05 (0.986 of H2D), best 54.18" in summary
    assert "target kernels_total_GBps: 460.7 vs 500.0: MISS" in summary


def _must_not_run(*args: Any) -> Any:
    raise AssertionError("a CPU figure was measured before the GPU error")
