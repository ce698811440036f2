"""`mosafs bench series|stripe|clients` end to end, small: real managers, benefactors and
writer processes, emulated links in network namespaces the benchmark makes (and must
delete), JSON on stdout, figures on disk."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mosafs.bench.testbed import PREFIX, links_unavailable
from tests.harness import cli

MiB = 1 << 20


def bench(*args: str) -> dict:  # type: ignore[type-arg]
    done = cli("bench", *args, "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(PREFIX)]


@pytest.fixture
def links() -> None:
    reason = links_unavailable()
    if reason:
        pytest.skip(reason)
    assert namespaces() == [], "a run before this test left namespaces"
    yield
    assert namespaces() == [], "the benchmark left its network namespaces behind"


def test_cluster_bench_series_non_ca_sends_everything_ca_dedupes(links: None,
                                                                tmp_path: Path) -> None:
    result = bench("series", "--quick", "--links", "netns", "--plot", str(tmp_path),
                   "--configs",
                   "non-CA fixed 1024K,CA-CPU cdc 1024K", "--size-mib", "8",
                   "--workload", "similar")
    assert result["params"]["links"]["rate_bit_s"] == 1_000_000_000
    non_ca, ca = result["runs"]
    assert [r["config"] for r in result["runs"]] == ["non-CA fixed 1024K", "CA-CPU cdc 1024K"]
    for r in result["runs"]:
        assert r["errors"] == [] and r["bytes_written"] == 3 * 8 * MiB
        assert r["first"]["asb_mb_s"] > 0 and r["later"]["oab_mb_s"] >= r["later"]["asb_mb_s"]
        assert r["client_cpu_s"] > 0 and len(r["steps"]) == 3
    assert non_ca["bytes_sent"] == non_ca["bytes_written"]
    assert non_ca["bytes_stored"] == non_ca["bytes_written"]
    assert non_ca["later"]["similarity"] == 0.0
    # The same file three times: content addressing sends the first only.
    assert ca["bytes_sent"] == ca["bytes_stored"] == 8 * MiB
    assert ca["later"]["similarity"] == 1.0 and ca["later"]["bytes_sent"] == 0
    assert set(result["targets"]) == {"ca-cpu_asb_vs_non_ca"}
    assert result["figures"] == [str(tmp_path / "series.png")]
    assert (tmp_path / "series.png").stat().st_size > 5000


@pytest.mark.parametrize("mode", ["netns", "ratelimit"])
def test_cluster_bench_stripe_spreads_over_w_links(mode: str,
                                                  request: pytest.FixtureRequest) -> None:
    if mode == "netns":
        request.getfixturevalue("links")  # skips without namespaces; checks they are gone
    result = bench("stripe", "--quick", "--widths", "1,2", "--size-mib", "8", "--links", mode)
    assert result["params"]["links"]["mode"] == mode
    assert [r["stripe_width"] for r in result["runs"]] == [1, 2]
    for r in result["runs"]:
        assert r["errors"] == [] and r["files"] == 2 and r["bytes_sent"] == 2 * 8 * MiB
        assert 0 < r["asb_mb_s"] <= r["oab_mb_s"]
    # One 1 Gbit/s link carries W=1: nothing gets through faster than the link.
    assert result["runs"][0]["asb_mb_s"] < 130
    assert "targets" not in result  # W=4 was not run


def test_cluster_bench_clients_on_loopback() -> None:
    result = bench("clients", "--quick", "--writers", "1,3", "--size-mib", "8",
                   "--links", "none")
    assert result["params"]["links"] is None
    one, three = result["runs"]
    assert (one["writers"], one["files"], three["writers"], three["files"]) == (1, 1, 3, 3)
    for r in result["runs"]:
        assert r["errors"] == [] and r["aggregate_mb_s"] > 0
        assert r["manager_write_transactions"] >= r["files"]  # a commit each, at least
        assert r["bytes"] == r["files"] * 8 * MiB


@pytest.mark.parametrize("args, message", [
    (("series", "--configs", "CA-CPU cdc 3K"), "unknown configuration 'CA-CPU cdc 3K'"),
    (("stripe", "--widths", "0,2"), "--widths: numbers 1..16"),
    (("clients", "--writers", "x"), "--writers: a comma-separated list"),
    (("series", "--size-mib", "0"), "must be 1..1024"),
])
def test_cluster_bench_bad_arguments_are_one_line(args: tuple[str, ...], message: str) -> None:
    done = cli("bench", *args, "--links", "none")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_cluster_bench_gpu_configuration_without_a_gpu_is_an_error() -> None:
    from mosafs.chunking.gpu import GpuBackend

    if GpuBackend.unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    done = cli("bench", "series", "--links", "none", "--configs", "CA-GPU cdc 1024K")
    assert done.returncode == 2
    assert "GPU hash backend requested but" in done.stderr


def test_emulated_hosts_take_the_congestion_control_asked_for(links: None,
                                                              tmp_path: Path) -> None:
    from mosafs.bench.procs import BenchError
    from mosafs.bench.testbed import Links, Testbed

    with Testbed(tmp_path / "bed", 1, links=Links(rate_bit=100_000_000,
                                                  congestion="reno")) as bed:
        assert len(bed.namespaces) == 2
        for ns in bed.namespaces:
            got = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n",
                                  "net.ipv4.tcp_congestion_control"],
                                 capture_output=True, text=True, check=True).stdout.strip()
            assert got == "reno", ns
        assert bed.status()["benefactors"][0]["alive"]
    # One the host does not allow namespaces is refused by name, and nothing is left.
    with pytest.raises(BenchError, match="'nonesuch' is not allowed"):
        Testbed(tmp_path / "bad", 1, links=Links(congestion="nonesuch")).__enter__()
    assert namespaces() == []
