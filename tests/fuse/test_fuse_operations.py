"""Operations through `mosafs up` (mutual TLS made by `up` itself): every metrics endpoint
that cluster.json names is scraped and its `mosafs_` series parse; JSON-lines logs land in
--log-dir; admin commands find the certificates from the mount."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.harness import cli, cli_json, scrape

MiB = 1 << 20


def test_fuse_metrics_logs_and_tls_of_up(start_cluster, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cluster = start_cluster("--log-dir", str(logs), "--log-format", "json")
    info = json.loads((cluster.data_dir / "cluster.json").read_text())
    assert info["tls"] == {"dir": str(cluster.data_dir / "tls"), "admin": "admin"}
    assert os.getxattr(cluster.mountpoint, "user.mosafs.tls").decode() == info["tls"]["dir"]
    data = os.urandom(3 * MiB)
    (cluster.mountpoint / "ckpt").write_bytes(data)
    (cluster.mountpoint / "again").write_bytes(data)  # every chunk found stored
    assert (cluster.mountpoint / "ckpt").read_bytes() == data

    client = scrape(info["metrics"]["client"])
    assert client["mosafs_client_written_bytes_total{}"] == 2 * len(data)
    assert client["mosafs_client_sent_bytes_total{}"] == len(data)
    assert client["mosafs_client_deduplicated_bytes_total{}"] == len(data)
    assert client["mosafs_client_commits_total{}"] == 2
    # Labelled by the backend `--hash-backend auto` took: cpu here, gpu on a GPU machine.
    backend = next(k.split("=")[1].rstrip("}") for k in client
                   if k.startswith("mosafs_client_hashed_bytes_total{backend="))
    assert client[f"mosafs_client_hashed_bytes_total{{backend={backend}}}"] >= 2 * len(data)
    assert client[f"mosafs_client_hash_seconds_total{{backend={backend}}}"] > 0
    assert client["mosafs_client_read_bytes_total{}"] >= len(data)
    assert client["mosafs_rpc_client_seconds_count{method=CommitVersion,service=manager}"] == 2
    manager = scrape(info["metrics"]["manager"])
    assert manager["mosafs_manager_commits_total{}"] == 2
    assert manager["mosafs_manager_committed_bytes_total{}"] == 2 * len(data)
    assert manager["mosafs_manager_benefactors{state=alive}"] == 3
    assert manager["mosafs_manager_metadata_write_transactions_total{}"] >= 4
    assert "mosafs_manager_replication_backlog_bytes{}" in manager
    stored = 0.0
    assert len(info["metrics"]["benefactors"]) == 3
    for url in info["metrics"]["benefactors"].values():
        benefactor = scrape(url)
        stored += benefactor.get("mosafs_benefactor_put_bytes_total{}", 0.0)
        assert "mosafs_benefactor_chunks{}" in benefactor
    assert stored >= len(data)

    # A file created and closed unwritten costs no write lease (nor its abort); its first
    # write takes one.
    def calls(method: str) -> float:
        key = f"mosafs_rpc_server_seconds_count{{method={method},service=manager}}"
        return scrape(info["metrics"]["manager"]).get(key, 0.0)

    leases, aborts = calls("OpenWrite"), calls("AbortWrite")
    before = os.stat(cluster.mountpoint)
    getattrs = calls("GetAttr")
    for i in range(5):
        (cluster.mountpoint / f"empty{i}").open("xb").close()
    assert (calls("OpenWrite"), calls("AbortWrite")) == (leases, aborts)
    # The kernel asks for the directory's attributes again after each create; the mount
    # answers from the times the create gave it, which are the manager's.
    after = os.stat(cluster.mountpoint)
    assert calls("GetAttr") - getattrs <= 2
    assert after.st_mtime_ns > before.st_mtime_ns and after.st_nlink == before.st_nlink
    time.sleep(1.2)  # past the kernel's and the mount's attribute timeouts: the manager's
    assert os.stat(cluster.mountpoint).st_mtime_ns == after.st_mtime_ns
    (cluster.mountpoint / "empty0").write_bytes(b"now written")
    assert calls("OpenWrite") == leases + 1
    assert (cluster.mountpoint / "empty0").read_bytes() == b"now written"
    assert (cluster.mountpoint / "empty1").stat().st_size == 0

    # Creates the kernel has in flight at once leave in Batch calls, each answered on its
    # own (docs/client.md, "Batched metadata calls").
    batches = calls("Batch")
    many = cluster.mountpoint / "many"

    def make(t: int) -> None:
        folder = many / f"t{t}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(40):
            (folder / f"f{i}").open("xb").close()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(make, range(16)))
    assert calls("Batch") > batches
    assert [len(os.listdir(many / f"t{t}")) for t in range(16)] == [40] * 16
    with pytest.raises(FileExistsError):
        (many / "t3" / "f7").open("xb")
    # In the folders this mount made, it knows every name: lookups of missing ones ask the
    # manager nothing (docs/client.md, "Coherent caches").
    reads, lookups = calls("BatchRead"), calls("Lookup")

    def missing(t: int) -> None:
        for i in range(40):
            assert not (many / f"t{t}" / f"none{i}").exists()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(missing, range(16)))
    assert (calls("BatchRead"), calls("Lookup")) == (reads, lookups)
    # Once a client beside the mount has asked for their cluster (as mosafs.checkpoint
    # does), it may make names there: lookups in flight at once then leave as BatchRead
    # calls (retried like a lone Lookup).
    for t in range(16):
        assert os.getxattr(many / f"t{t}", "user.mosafs.manager").decode() == \
            info["manager"]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(missing, range(16)))
    assert calls("BatchRead") > reads

    # Admin commands find the certificates of the mount (user.mosafs.tls): no flags.
    assert cli_json("stats", str(cluster.mountpoint / "ckpt"))["size"] == len(data)
    assert cli("fsck", str(cluster.mountpoint)).returncode == 0

    for name in ("manager", "benefactor-0", "mount"):
        lines = (logs / f"{name}.log").read_text().splitlines()
        assert lines, name
        for line in lines:
            record = json.loads(line)
            assert {"time", "level", "logger", "pid", "message"} <= set(record), line
    assert not (cluster.data_dir / "logs").exists()


def test_fuse_mount_without_the_clusters_certificate_is_refused(start_cluster,
                                                               tmp_path: Path) -> None:
    """A plaintext mount, or one with a certificate of another CA, never reaches the TLS
    manager of `mosafs up`: it stops with one line and exit code 7, mounting nothing."""
    cluster = start_cluster()
    other = tmp_path / "other-ca"
    assert cli("certs", "init", "--dir", str(other)).returncode == 0
    assert cli("certs", "issue", "client", "--role", "client", "--dir", str(other)).returncode == 0
    mnt = tmp_path / "refused"
    mnt.mkdir()
    for credentials in (["--insecure"], ["--tls-dir", str(other)]):
        done = cli("mount", str(mnt), "--manager", cluster.manager, "--manager-timeout", "1",
                   "--log-level", "WARNING", *credentials)
        assert done.returncode == 7, done.stderr
        assert "did not answer within 1 s" in done.stderr and "TLS" in done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not os.path.ismount(mnt)
