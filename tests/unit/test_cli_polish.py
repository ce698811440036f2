"""A newcomer's first hour without surprises (issue 16): the README's command table says what
`mosafs --help` says; every size and count of the benchmarks is checked as it is parsed;
`bench backends` runs where there is no GPU; `certs` names the command that helps; output
into a closed pipe ends quietly; a failed `up` takes back the mount point it made."""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mosafs.cli import COMMANDS, EXIT_BROKEN_PIPE, build_parser

ROOT = Path(__file__).resolve().parents[2]


def mosafs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "mosafs", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


# -- the README's table against the parser --------------------------------------------------

def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                None)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
              ) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command a user can run: a leaf, or a command whose actions are optional (the
    `benefactor` daemon), by its words after `mosafs`."""
    found = {}
    sub = _subparsers(parser)
    if path and (sub is None or not sub.required):
        found[path] = parser
    for name, child in (sub.choices.items() if sub else ()):
        found.update(_commands(child, (*path, name)))
    return found


def _readme_rows() -> list[str]:
    """The first cell of every row of the README's command table."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("| command | what it does |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(re.split(r"(?<!\\)\|", line)[1])
    return rows


def _check_usage(text: str, root: argparse.ArgumentParser) -> tuple[list[tuple[str, ...]],
                                                                     list[str]]:
    """The commands one usage line of the README names (`mosafs pool create\\|set NAME
    [--replication R]`), and what is wrong with it: a word that is no subcommand, an option
    the command lacks, more or fewer arguments than the command takes."""
    words = [w.strip("[]()") for w in text.replace("\\|", "|").split()]
    assert words[0] == "mosafs", text
    parsers, paths, i = [root], [()], 1
    while i < len(words) and all(_subparsers(p) for p in parsers):
        names = words[i].split("|")
        subs = [_subparsers(p) for p in parsers]
        if not all(s is not None and n in s.choices for s in subs for n in names):
            break
        parsers = [s.choices[n] for s in subs if s is not None for n in names]
        paths = [(*path, n) for path in paths for n in names]
        i += 1
    problems, arguments = [], 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            takes_value = False
            for parser, path in zip(parsers, paths, strict=True):
                action = next((a for a in parser._actions if word in a.option_strings), None)
                if action is None:
                    problems.append(f"`mosafs {' '.join(path)}` has no option {word}")
                takes_value |= action is not None and action.nargs != 0
            i += takes_value  # skip its value
        elif re.fullmatch(r"[A-Z][A-Z_:]*", word):
            arguments += 1
        elif word not in ("|", "..."):
            problems.append(f"{word!r} is neither a subcommand nor an argument")
    for parser, path in zip(parsers, paths, strict=True):
        positional = [a for a in parser._actions if not a.option_strings]
        need = sum(1 for a in positional if a.required)
        if not need <= arguments <= len(positional):
            problems.append(f"`mosafs {' '.join(path)}` takes {need}..{len(positional)} "
                            f"arguments, the README gives {arguments}")
    return paths, problems


def test_the_readme_table_lists_every_subcommand_with_real_options() -> None:
    root = build_parser()
    named: set[tuple[str, ...]] = set()
    problems = []
    for cell in _readme_rows():
        for usage in re.findall(r"`(mosafs[^`]*)`", cell):
            paths, wrong = _check_usage(usage, root)
            named.update(paths)
            problems += [f"{usage}: {w}" for w in wrong]
    assert not problems, "\n".join(problems)
    missing = sorted(" ".join(p) for p in set(_commands(root)) - named)
    assert not missing, f"commands of `mosafs --help` not in the README's table: {missing}"


def test_the_table_check_catches_what_issue_16_found() -> None:
    root = build_parser()
    assert _check_usage("mosafs pool list NAME", root)[1] == [
        "`mosafs pool list` takes 0..0 arguments, the README gives 1"]
    assert _check_usage("mosafs pool frobnicate NAME", root)[1] == [
        "'frobnicate' is neither a subcommand nor an argument"]
    assert "`mosafs certs init` has no option --role" in \
        _check_usage("mosafs certs init\\|issue --role ROLE --dir DIR", root)[1]
    commands = _commands(root)
    for command in [("pool", "unassign"), ("bench", "write"), ("benefactor",),
                    ("benefactor", "list"), ("up",)]:
        assert command in commands
    assert ("bench",) not in commands and ("pool",) not in commands  # actions required


def test_every_subcommand_of_mosafs_help_is_in_the_parser_walked() -> None:
    """The subcommands the table check walks are those `mosafs --help` prints."""
    done = mosafs("--help")
    assert done.returncode == 0
    shown = set(re.findall(r"^ {4}(\w+)(?: |$)", done.stdout, re.MULTILINE))
    assert shown == {path[0] for path in _commands(build_parser())}


# -- a command loads what it needs ----------------------------------------------------------

def _loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running CODE."""
    done = subprocess.run([sys.executable, "-P", "-c", code + "\nimport sys\n"
                           "print(' '.join(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=120, check=True)
    return set(done.stdout.split())


def test_a_command_imports_its_own_module_only() -> None:
    """Every process of the cluster and every admin command starts through the parser: a
    command's process builds its own options, not those of every command."""
    loaded = _loaded_after("from mosafs import cli\ncli.build_parser('status')")
    assert "mosafs.admin.cluster" in loaded
    others = {"mosafs.up", "mosafs.client.main", "mosafs.bench.cli", "mosafs.manager.main",
              "mosafs.benefactor.main", "mosafs.admin.pools"}
    assert not others & loaded, others & loaded
    # The whole parser, for --help and an unknown command, still has every command.
    whole = _subparsers(build_parser())
    assert whole is not None and set(whole.choices) == set(COMMANDS)


def test_the_manager_and_admin_commands_load_no_backend() -> None:
    """The chunking and coding factories load NumPy, ISA-L and CuPy: a process that only
    reads specs (the manager, `mosafs status`) loads none of them."""
    loaded = _loaded_after("import mosafs.manager.main, mosafs.manager.active, "
                           "mosafs.manager.servicer, mosafs.admin.cluster, mosafs.admin.pools")
    assert not {"numpy", "mosafs.chunking.registry", "mosafs.erasure.registry"} & loaded
    # The packages still hand out their factories, loaded on first use.
    import mosafs.chunking
    import mosafs.erasure
    from mosafs.chunking import registry
    from mosafs.erasure import registry as coders

    assert mosafs.chunking.make_chunker is registry.make_chunker
    assert mosafs.erasure.make_coder is coders.make_coder
    with pytest.raises(AttributeError, match="no attribute 'make_chunkr'"):
        mosafs.chunking.make_chunkr  # noqa: B018


# -- benchmarks: sizes and counts, backends, tables -------------------------------------------

BAD_COUNTS = [
    ("write", "--size-mib", "0"), ("write", "--memory-mib", "0"), ("write", "--repeat", "0"),
    ("hash", "--cpu-mib", "0"), ("hash", "--gpu-gib", "0"), ("hash", "--kernel-mib", "0"),
    ("hash", "--repeat", "0"), ("backends", "--size-mib", "0"),
    ("durability", "--files", "0"), ("durability", "--file-mib", "0"),
    ("series", "--size-mib", "0"), ("series", "--steps", "0"), ("series", "--regions", "0"),
    ("stripe", "--size-mib", "0"), ("stripe", "--widths", "0,1"),
    ("clients", "--size-mib", "-1"), ("clients", "--writers", "2,zero"),
]


@pytest.mark.parametrize(("bench", "flag", "value"), BAD_COUNTS)
def test_bench_sizes_and_counts_must_be_positive(bench: str, flag: str, value: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", bench, f"{flag}={value}"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"mosafs bench {bench}: argument {flag}: ") and "\n" not in error


def test_bench_write_size_zero_is_an_error_not_64_mib(tmp_path: Path) -> None:
    done = mosafs("bench", "write", "--size-mib", "0", "--keep", str(tmp_path / "run"))
    assert done.returncode == 2
    assert one_line(done) == ("mosafs bench write: argument --size-mib: must be 1..1048576, "
                              "got '0' (see mosafs bench write --help)")
    assert not (tmp_path / "run").exists()  # nothing ran


def test_bench_backends_defaults_to_the_backends_usable_here() -> None:
    from mosafs.bench.cli import _backends
    from mosafs.chunking.gpu import GpuBackend
    from mosafs.errors import ConfigError

    reason = GpuBackend.unavailable_reason()
    if reason is None:
        assert _backends(None) == (["cpu", "gpu"], {})
    else:
        assert _backends(None) == (["cpu"], {"gpu": reason})
        with pytest.raises(ConfigError, match=re.escape(reason)):
            _backends("cpu,gpu")  # asked for by name: still an error without one
    assert _backends("cpu") == (["cpu"], {})
    with pytest.raises(ConfigError, match="--backends takes"):
        _backends("cpu,tpu")


def test_bench_backends_gpu_named_without_one_is_a_one_line_error() -> None:
    from mosafs.chunking.gpu import GpuBackend

    if GpuBackend.unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    done = mosafs("bench", "backends", "--backends", "gpu", "--size-mib", "1")
    assert done.returncode == 2
    assert one_line(done).startswith("mosafs bench backends: GPU hash backend requested")


def test_storage_tables_are_for_people() -> None:
    from mosafs.bench.storage import format_table

    runs = [{"stripe_width": w, "files": 2, "oab_mb_s": 300.0 * w, "asb_mb_s": 100.0 * w,
             "client_cpu_s": 0.5, "errors": [], "bytes_sent": 1 << 22} for w in (1, 4)]
    result = {"benchmark": "mosafs bench stripe", "runs": runs,
              "params": {"workload": {"kind": "different", "steps": 2, "size": 1 << 21},
                         "links": None, "quick": True},
              "targets": {"w4_vs_w1_asb": {"ratio": 4.0, "target": 3.5, "pass": True}}}
    table = format_table(result).splitlines()
    assert table[0] == "mosafs bench stripe: different workload, 2 x 2 MiB, loopback; quick"
    assert table[2].split() == ["stripe", "width", "files", "OAB", "ASB", "client", "CPU",
                                "s", "errors"]
    assert table[3].split() == ["1", "2", "300", "MB/s", "100", "MB/s", "0.5", "0"]
    assert "  w4_vs_w1_asb: ratio 4.0, target 3.5  PASS" in table


# -- certificates ------------------------------------------------------------------------------

def test_certs_list_of_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    done = mosafs("certs", "list", "--dir", str(tmp_path / "nowhere"))
    assert done.returncode == 3 and done.stdout == ""
    assert one_line(done) == (f"mosafs certs list: no TLS directory {tmp_path / 'nowhere'} "
                              f"(make one with `mosafs certs init --dir "
                              f"{tmp_path / 'nowhere'}`)")


def test_certs_list_of_an_empty_directory_says_so(tmp_path: Path) -> None:
    done = mosafs("certs", "list", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"no certificates in {tmp_path} (`mosafs certs issue` makes them)\n"


def test_a_missing_ca_points_to_certs_init(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    assert mosafs("certs", "init", "--dir", str(tls)).returncode == 0
    assert mosafs("certs", "issue", "manager", "--role", "manager", "--dir",
                  str(tls)).returncode == 0
    (tls / "ca.crt").unlink()
    done = mosafs("manager", "--data-dir", str(tmp_path / "m"), "--tls-dir", str(tls))
    assert done.returncode == 3
    line = one_line(done)
    assert f"{tls / 'ca.crt'} is missing" in line
    assert f"`mosafs certs init --dir {tls}`" in line and "certs issue manager" not in line
    assert mosafs("certs", "init", "--dir", str(tmp_path / "ok")).returncode == 0
    done = mosafs("manager", "--data-dir", str(tmp_path / "m"), "--tls-dir",
                  str(tmp_path / "ok"), "--tls-name", "other")
    assert done.returncode == 3
    assert f"`mosafs certs issue other --dir {tmp_path / 'ok'} --role ROLE`" in one_line(done)


# -- output into a closed pipe -----------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_with_certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tls = tmp_path_factory.mktemp("tls")
    assert mosafs("certs", "init", "--dir", str(tls)).returncode == 0
    for name in ("a", "b", "c"):
        assert mosafs("certs", "issue", name, "--role", "client", "--dir",
                      str(tls)).returncode == 0
    return tls


@pytest.mark.parametrize(("args", "buffered"), [
    (["certs", "list", "--dir", "{tls}"], True),
    (["certs", "list", "--dir", "{tls}"], False),  # each print() writes at once
    (["--help"], True),  # argparse's own output, flushed by main() on the way out
])
def test_a_reader_that_goes_away_ends_the_command_quietly(tls_with_certificates: Path,
                                                           args: list[str],
                                                           buffered: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    argv = [a.replace("{tls}", str(tls_with_certificates)) for a in args]
    proc = subprocess.Popen([sys.executable, "-P", "-m", "mosafs", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command can write: its first write finds no reader
    with proc.stderr:
        stderr = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert (proc.returncode, stderr) == (EXIT_BROKEN_PIPE, "")
    assert EXIT_BROKEN_PIPE == 141  # 128 + SIGPIPE, what the shell reports for `seq | head`


# -- a failed `up` takes back the mount point it made -----------------------------------------

def test_a_failed_up_removes_the_mount_point_it_made(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    mountpoint = tmp_path / "new" / "deeper" / "mnt"
    with open(data / "up.lock", "w") as lock:  # another `up` runs on DATA
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = mosafs("up", str(mountpoint), "--data-dir", str(data), "--insecure")
    assert done.returncode == 2
    assert one_line(done) == f"mosafs up: another mosafs up is running on {data}"
    assert not (tmp_path / "new").exists()


def test_an_up_whose_manager_fails_removes_the_mount_point_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "manager").write_text("not a directory")  # the manager cannot start
    (tmp_path / "kept").mkdir()  # existed before: stays
    mountpoint = tmp_path / "kept" / "mnt"
    done = mosafs("up", str(mountpoint), "--data-dir", str(data), "--insecure",
                  "--benefactors", "1")
    assert done.returncode != 0
    assert "manager exited with status" in done.stderr, done.stderr
    assert not mountpoint.exists() and (tmp_path / "kept").is_dir()


def test_a_failed_up_keeps_a_mount_point_that_existed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "manager").parent.mkdir(parents=True)
    (data / "manager").write_text("not a directory")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    done = mosafs("up", str(mountpoint), "--data-dir", str(data), "--insecure",
                  "--benefactors", "1")
    assert done.returncode != 0
    assert mountpoint.is_dir()
