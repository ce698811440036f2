"""`mosafs bench write`'s issue-17 parts: the MooseFS peer's configuration and the choice of
peer (no MooseFS needed), the multi-file null file system, concurrent writers on a local
directory, the checkpoint series' workload, the comparisons and the table. One test runs
a real private MooseFS cluster where MooseFS is installed and this is root; elsewhere (CI)
it skips, saying why."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from mosafs.bench import moosefs, phases
from mosafs.bench.timing import write_file
from mosafs.bench.write import targets
from mosafs.bench.write_run import format_table
from mosafs.errors import ConfigError

MiB = 1 << 20


# -- configuration ------------------------------------------------------------------------------

def test_layout_writes_private_configuration(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "metadata.mfs.empty"
    empty.write_bytes(b"MFSM NEW")
    monkeypatch.setattr(moosefs, "EMPTY_METADATA", empty)
    lay = moosefs.Layout(tmp_path / "mfs", fsync=True, user="u", group="g")
    lay.write()

    master = (lay.etc / "mfsmaster.cfg").read_text()
    assert f"DATA_PATH = {lay.master_data}\n" in master
    assert f"EXPORTS_FILENAME = {lay.etc / 'mfsexports.cfg'}\n" in master
    assert "MATOCS_LISTEN_HOST = 10.214.0.1\nMATOCS_LISTEN_PORT = 9420\n" in master
    assert "MATOCL_LISTEN_PORT = 9421\n" in master
    assert "NICE_LEVEL = 0\n" in master and "WORKING_USER = u\n" in master
    for i in range(3):
        cs = (lay.etc / f"mfschunkserver{i}.cfg").read_text()
        assert f"DATA_PATH = {lay.chunkserver_data(i)}\n" in cs
        assert f"HDD_CONF_FILENAME = {lay.etc / f'mfshdd{i}.cfg'}\n" in cs
        assert "MASTER_HOST = 10.214.0.1\nMASTER_PORT = 9420\n" in cs
        assert f"CSSERV_LISTEN_PORT = {9422 + i}\n" in cs
        assert "HDD_FSYNC_BEFORE_CLOSE = 1\n" in cs
        assert (lay.etc / f"mfshdd{i}.cfg").read_text() == f"{lay.disk(i)}\n"
        assert lay.disk(i).is_dir() and lay.chunkserver_data(i).is_dir()
    assert (lay.etc / "mfsexports.cfg").read_text() == "10.214.0.1/32 / rw,alldirs,maproot=0\n"
    assert (lay.master_data / "metadata.mfs").read_bytes() == b"MFSM NEW"
    paths = [word for p in lay.etc.iterdir() for word in p.read_text().split()
             if word.startswith("/") and word != "/"]
    assert paths and all(word.startswith(f"{tmp_path}/mfs/") for word in paths)  # no /etc/mfs
    assert "HDD_FSYNC_BEFORE_CLOSE = 0" in moosefs.Layout(tmp_path).chunkserver_cfg(0)


def test_master_log_and_fileinfo_parsers() -> None:
    log = ("mfsmaster[1]: chunkserver register begin (packet version: 6) - ip: 10.214.0.1 / "
           "port: 9424, usedspace: 0\n"
           "mfsmaster[1]: chunkserver register end (packet version: 6) - ip: 10.214.0.1 / "
           "port: 9422\n"
           "mfsmaster[1]: chunkserver register end (packet version: 6) - ip: 10.214.0.1 / "
           "port: 9423\n")
    assert moosefs.registered_ports(log) == {9422, 9423}
    info = ("/m/f:\n\tchunk 0: 01 / (id:1 ver:1)\n\t\tcopy 1: 10.214.0.1:9423 (status:VALID)\n"
            "\t\tcopy 2: 10.214.0.1:9424 (status:VALID)\n\tchunk 1: 02 / (id:2 ver:1)\n"
            "\t\tcopy 1: 10.214.0.1:9422 (status:VALID)\n")
    assert moosefs.parse_fileinfo(info) == {"chunks": 2, "min_copies": 1, "max_copies": 2}


def test_listening_reads_proc_net_tcp() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not moosefs.listening(os.getpid(), port)
        s.listen()
        assert moosefs.listening(os.getpid(), port)
    assert not moosefs.listening(2**22 + 12345, port)


# -- which peer -----------------------------------------------------------------------------

def test_choose_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    assert moosefs.choose_peer("none") == "not asked for (--peer none)"
    with pytest.raises(ConfigError):
        moosefs.choose_peer("lustre")
    monkeypatch.setattr(moosefs.shutil, "which", lambda name: None)
    reason = moosefs.choose_peer("auto")
    assert reason is not None and moosefs.APT_COMMAND in reason
    with pytest.raises(ConfigError) as error:
        moosefs.choose_peer("moosefs")
    assert error.value.exit_code == 2 and moosefs.APT_COMMAND in error.value.message
    assert "\n" not in error.value.message


def test_peer_moosefs_missing_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "mosafs", "bench", "write", "--peer", "moosefs",
         "--keep", str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": str(tmp_path)})  # no MooseFS program on this PATH
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mosafs bench write: --peer moosefs: ")
    assert lines[0].endswith(moosefs.APT_COMMAND)
    assert not (tmp_path / "run").exists()  # nothing ran


@pytest.mark.parametrize("flag,value", [("--writers", "0"), ("--writers", "65"),
                                        ("--series-mib", "1025"), ("--series-steps", "0"),
                                        ("--peer", "lustre")])
def test_new_flags_are_checked_as_parsed(flag: str, value: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from mosafs.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "write", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_space_reason(tmp_path: Path) -> None:
    assert moosefs.space_reason(tmp_path, 0) is None or "free" in str(
        moosefs.space_reason(tmp_path, 0))
    reason = moosefs.space_reason(tmp_path, 1 << 60)
    assert reason is not None and "needed" in reason


# -- the null file system with several files -------------------------------------------------

def test_null_files_each_have_their_own_size() -> None:
    from mosafs.bench.nullfiles import NullFiles
    from mosafs.bench.nullfs import ROOT

    ops = NullFiles(3)

    async def scenario() -> None:
        a = (await ops.lookup(ROOT, b"data.0")).st_ino
        b = (await ops.lookup(ROOT, b"data.2")).st_ino
        assert a != b
        fa = await ops.open(a, os.O_WRONLY | os.O_TRUNC, None)
        fb = await ops.open(b, os.O_WRONLY | os.O_TRUNC, None)
        assert await ops.write(fa.fh, 0, b"x" * 5000) == 5000
        assert await ops.write(fb.fh, 0, b"y" * 10) == 10
        assert (await ops.getattr(a)).st_size == 5000
        assert (await ops.getattr(b)).st_size == 10
        assert bytes(await ops.read(fb.fh, 0, 100)) == bytes(10)
        attr = await ops.setattr(a, SimpleNamespace(st_size=7), SimpleNamespace(
            update_size=True), None, None)
        assert attr.st_size == 7
        with pytest.raises(Exception, match="No such file"):
            await ops.lookup(ROOT, b"data")

    trio.run(scenario)


# -- writers and the series ----------------------------------------------------------------------

def test_concurrent_writers_on_a_directory(tmp_path: Path) -> None:
    assert phases.writer_counts(4) == [1, 4] and phases.writer_counts(1) == [1]
    runs = phases.writer_runs(tmp_path, [1, 2], 4 * MiB, "t", lambda: {}, "local")
    assert [r["writers"] for r in runs] == [1, 2]
    for r in runs:
        assert r["bytes"] == 4 * MiB and r["aggregate_mb_s"] > 0
        assert len(r["per_writer_mb_s"]) == r["writers"]
    one, two = (tmp_path / "n2.w0.bin").read_bytes(), (tmp_path / "n2.w1.bin").read_bytes()
    assert len(one) == len(two) == 2 * MiB and one != two  # distinct data: nothing dedupes


def test_write_file_fsync(tmp_path: Path) -> None:
    t = write_file(tmp_path / "f", b"z" * MiB, 4096, fsync=True)
    assert (tmp_path / "f").stat().st_size == MiB and t.closed >= t.written


def test_series_steps_keep_about_nine_chunks_in_ten() -> None:
    from mosafs.bench.workloads import steps

    w = phases.series_workload(32 * MiB, 2, "t")
    first, second = steps(w)
    same = sum(first[i:i + MiB] == second[i:i + MiB] for i in range(0, len(first), MiB))
    assert 0.7 <= same / 32 <= 0.9


def test_series_phase_on_directories(tmp_path: Path) -> None:
    w = phases.series_workload(2 * MiB, 2, "t")
    out = phases.series_phase(tmp_path / "fs", tmp_path / "local", w, lambda: {})
    assert [r["name"] for r in out["steps"]] == ["ckpt.0.1", "ckpt.0.2"]
    assert (tmp_path / "fs" / "ckpt.0.2").stat().st_size == 2 * MiB
    assert not (tmp_path / "local").exists()  # the local copies are removed
    assert all(r["ratio_vs_local_fsync"] > 0 for r in out["steps"])


# -- comparisons and the table -------------------------------------------------------------------

def _result() -> dict[str, Any]:
    def write(oab: float) -> dict[str, Any]:
        return {"oab_mb_s": oab, "asb_mb_s": oab, "peak_rss_bytes": 300 * MiB,
                "bytes": 1024 * MiB}

    def runs(*mb_s: float) -> list[dict[str, Any]]:
        return [{"writers": n, "aggregate_mb_s": v} for n, v in zip((1, 4), mb_s, strict=True)]

    def step(n: int, ours: float, local: float) -> dict[str, Any]:
        return {"step": n, "bytes": 1024 * MiB, "mosafs_s": ours, "local_fsync_s": local,
                "local_s": 0.5, "ratio_vs_local_fsync": round(ours / local, 3),
                "unchanged_chunks": 0.9}

    return {
        "params": {"size_bytes": 1024 * MiB},
        "nullfs": {"write_1m": {"mb_s": 1000.0}, "write_4k": {"mb_s": 50.0},
                   "read_1m": {"mb_s": 1500.0}},
        "mosafs": {"write_1m": write(240.0), "write_4k": write(40.0),
                   "read_cold": {"mb_s": 300.0}, "read_warm": {"mb_s": 900.0},
                   "window_bytes": 64 * MiB},
        "moosefs": {"write_1m": write(200.0), "write_4k": write(60.0),
                    "read_cold": {"mb_s": 250.0}, "read_warm": {"mb_s": 1000.0}},
        "writers": {"counts": [1, 4], "nullfs": runs(1000.0, 1500.0),
                    "mosafs": runs(200.0, 300.0), "moosefs": runs(180.0, 250.0)},
        "series": {"steps": [step(1, 3.0, 2.5), step(2, 1.0, 2.5), step(3, 2.6, 2.5)]},
    }


def test_comparisons_ratios_and_pass_flags() -> None:
    c = phases.comparisons(_result())
    assert c["oab_1m_vs_moosefs"]["value"] == pytest.approx(1.2)
    assert c["oab_1m_vs_moosefs"]["pass"] is True
    assert c["oab_4k_vs_moosefs"]["pass"] is False
    assert c["cold_read_vs_moosefs"]["value"] == pytest.approx(1.2)
    assert c["writers_4_vs_null"]["value"] == pytest.approx(0.2)
    assert c["writers_4_vs_null"]["pass"] is False
    assert c["series_step_1_vs_local_fsync"]["pass"] is True  # 1.2 <= 1.5
    later = c["series_later_steps_vs_local_fsync"]
    assert later["per_step"] == [0.4, 1.04] and later["pass"] is False


def test_comparisons_without_a_peer() -> None:
    result = _result()
    result["moosefs"] = {"skipped": "not asked for (--peer none)"}
    del result["writers"]["moosefs"]
    c = phases.comparisons(result)
    assert not [name for name in c if "moosefs" in name]
    result["targets"] = targets(result)
    result["comparisons"] = c
    table = format_table(result)
    assert "MooseFS peer" in table and "skipped: not asked for" in table
    assert "4 concurrent writers, 1 MiB writes, aggregate  null 1500, mosafs 300 MB/s" in table


def test_table_has_the_new_rows() -> None:
    result = _result()
    result["writers"]["ratios"] = phases.writer_ratios(result["writers"])
    assert result["writers"]["ratios"] == {"mosafs_vs_nullfs": {"1": 0.2, "4": 0.2},
                                           "mosafs_vs_moosefs": {"1": 1.111, "4": 1.2}}
    result["targets"] = targets(result)
    result["comparisons"] = phases.comparisons(result)
    table = format_table(result)
    for text in ("MooseFS write 1024 MiB, 1 MiB writes", "mosafs/MooseFS 1.20",
                 "MooseFS cold read",
                 "null 1500, mosafs 300, MooseFS 250 MB/s (mosafs/MooseFS 1.20)",
                 "series step 2, 1024 MiB", "oab_1m_vs_moosefs", "writers_4_vs_null",
                 "series_later_steps_vs_local_fsync"):
        assert text in table, text


# -- a real MooseFS cluster, where there is one -----------------------------------------------

def _no_cluster() -> str | None:
    from tests.conftest import fuse_available

    return moosefs.unavailable_reason() or fuse_available()


@pytest.mark.timeout(240)
@pytest.mark.skipif(_no_cluster() is not None, reason=f"no MooseFS cluster here: {_no_cluster()}")
def test_private_moosefs_cluster_starts_keeps_two_copies_and_leaves_nothing(
        tmp_path: Path) -> None:
    fs = moosefs.MooseFs(tmp_path / "mfs")
    with fs:
        data = os.urandom(3 * MiB)
        (fs.mnt / "f").write_bytes(data)
        assert fs.copies(fs.mnt / "f") == {"chunks": 1, "min_copies": 2, "max_copies": 2}
        fs.unmount()
        fs.mount()
        assert (fs.mnt / "f").read_bytes() == data
        pids = list(fs.pids().values())
        assert set(fs.pids()) >= {"mfsmaster", "mfschunkserver-0", "mfschunkserver-2",
                                  "mfsmount"}
    assert not [pid for pid in pids if moosefs.alive(pid)]
    assert not os.path.ismount(fs.mnt)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert fs.namespace not in names
