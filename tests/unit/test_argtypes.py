"""The one size parser (mosafs.argtypes) behind every size option: what it accepts, what it
refuses, and that a bad size reaches the user as one line from every command, whether it
came from a flag, the config file or the environment."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from mosafs import config
from mosafs.argtypes import MAX_SIZE, MiB, byte_size, parse_size
from mosafs.errors import ConfigError

K, M, G, T = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(("text", "size"), [
    ("0", 0), ("1", 1), ("1048576", M), ("512K", 512 * K), ("2M", 2 * M), ("16G", 16 * G),
    ("1.5G", 3 * G // 2), ("1GiB", G), ("1Gi", G), ("1GB", G), ("1gb", G), ("8m", 8 * M),
    ("2T", 2 * T), ("1P", 1 << 50), (".5M", M // 2), ("0.5K", 512),
    ("1.1T", 1209462790553), ("0.1K", 102),  # a fraction of a byte with a unit: dropped
    ("7B", 7), (" 3 K ", 3 * K), ("1 MiB", M),
    ("9007199254740993", 9007199254740993),  # beyond 2**53: exact, no float rounding
])
def test_sizes_accepted(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "why"), [
    ("", "not a size"), ("M", "not a size"), ("x", "not a size"), ("-1", "not a size"),
    ("+1", "not a size"), ("1e3", "not a size"), ("1/2", "not a size"), ("inf", "not a size"),
    ("nan", "not a size"), ("2MM", "not a size"), ("1.5.2", "not a size"),
    ("1_000", "not a size"), ("1iB", "not a size"), ("1i", "not a size"),
    ("2X", "not a size"), ("\u0661\u0662", "not a size"),  # Arabic-Indic digits
    ("1.3", "whole number of bytes"), ("0.5", "whole number of bytes"),
    ("8E", "too large"), ("99999999999999999999999", "too large"),
])
def test_sizes_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=why) as info:
        parse_size(text)
    assert "\n" not in str(info.value) and repr(text) in str(info.value)


def test_byte_size_bounds_and_units() -> None:
    at_least_1m = byte_size(MiB)
    assert at_least_1m("2M") == 2 * M and at_least_1m("1048576") == M
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1 MiB, got '512K'"):
        at_least_1m("512K")
    rate = byte_size(0)  # 0 turns a rate off
    assert rate("0") == 0 and rate("0M") == 0 and rate("8M") == 8 * M
    bounded = byte_size(K, 4 * K)
    with pytest.raises(argparse.ArgumentTypeError, match=r"1 KiB\.\.4 KiB"):
        bounded("5K")
    in_mib = byte_size(MiB, unit=MiB)  # --window-mib: a bare number counts MiB
    assert in_mib("64") == 64 and in_mib("1G") == 1024 and in_mib("2048K") == 2
    with pytest.raises(argparse.ArgumentTypeError, match="whole number of MiB"):
        in_mib("1.5M")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1 MiB"):
        in_mib("0")
    assert byte_size()(str(MAX_SIZE)) == MAX_SIZE


def test_config_file_and_environment_use_the_same_parser(tmp_path: Path) -> None:
    from mosafs.manager.main import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    toml = tmp_path / "mosafs.toml"
    toml.write_text('[manager]\nmap-size = "1.5G"\n')
    assert config.apply(parser, "manager", toml, environ={}) == {"map_size": 3 * G // 2}
    assert config.apply(parser, "manager", None,
                        environ={"MOSAFS_MANAGER_MAP_SIZE": "2M"}) == {"map_size": 2 * M}
    toml.write_text("[manager]\nmap-size = 4194304\n")  # a TOML integer: plain bytes
    assert config.apply(parser, "manager", toml, environ={}) == {"map_size": 4 * M}
    with pytest.raises(ConfigError, match="MOSAFS_MANAGER_MAP_SIZE: not a size in bytes: '2X'"):
        config.apply(parser, "manager", None, environ={"MOSAFS_MANAGER_MAP_SIZE": "2X"})


@pytest.mark.parametrize(("args", "message"), [
    (["manager", "--data-dir", "{tmp}/m", "--map-size", "2X"],
     "argument --map-size: not a size in bytes: '2X'"),
    (["manager", "--data-dir", "{tmp}/m", "--map-size", "512K"],
     "argument --map-size: must be at least 1 MiB, got '512K'"),
    (["benefactor", "--data-dir", "{tmp}/b", "--capacity", "1.3"],
     "argument --capacity: not a whole number of bytes: '1.3'"),
    (["benefactor", "--data-dir", "{tmp}/b", "--scrub-rate=-8M"],
     "argument --scrub-rate: not a size in bytes: '-8M'"),
    (["benefactor", "--data-dir", "{tmp}/b", "--ingest-rate", "fast"],
     "argument --ingest-rate: not a size in bytes: 'fast'"),
    (["mount", "{tmp}/mnt", "--window-mib", "1.5M"],
     "argument --window-mib: not a whole number of MiB: '1.5M'"),
    (["mount", "{tmp}/mnt", "--cache-mib", "lots"], "argument --cache-mib: not a size"),
])
def test_bad_sizes_are_one_line_errors_of_every_command(tmp_path: Path, args: list[str],
                                                        message: str) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = subprocess.run([sys.executable, "-m", "mosafs", *argv], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m").exists() and not (tmp_path / "b").exists()  # nothing started
