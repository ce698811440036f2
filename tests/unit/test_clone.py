"""A clone stands on its own (issue 16): the repository's files alone, with no shared/
folder beside them, collect every test and pass the chunking vector tests, reading the
vectors from the clone; and scripts/check_shared.sh, which the test command runs first,
fails loudly when the repository's copies drift from a shared/ folder beside it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
CHILD_LIMIT_S = 200
"""Well inside the 300 s test timeout, so that a stuck child reports its stacks."""

# Run pytest inside the clone with an audit hook that records every file opened whose name
# says it is a vector or the design contract, and where the packages came from.
PYTEST_WITH_AUDIT = """
import faulthandler, json, os, sys
# Should it ever hang, every thread's stack reaches stderr before the parent gives up.
faulthandler.dump_traceback_later(float(os.environ["DUMP_AFTER_S"]), exit=True)
seen = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if "-v1.json" in path or path.endswith(("DESIGN.md", "design.md")):
            seen.append(os.path.abspath(path))
sys.addaudithook(hook)
import pytest
code = pytest.main(sys.argv[1:])
modules = {name: getattr(sys.modules.get(name), "__file__", None)
           for name in ("mosafs", "tests.conftest")}
with open(os.environ["AUDIT_OUT"], "w") as f:
    json.dump({"opened": sorted(set(seen)), "modules": modules}, f)
sys.exit(int(code))
"""


def _repository_files() -> list[str]:
    """What a clone of this checkout holds: files git tracks or would add (the working
    tree's version, so that changes not committed yet count)."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: nothing tells which files a clone holds")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    return [f for f in listed.stdout.decode().split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("clone") / "mosafs"
    for name in _repository_files():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, where / name)
    assert not (where.parent / "shared").exists()
    return where


def _pytest_in(clone: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    """pytest ARGS in CLONE with this interpreter; its output and what it opened."""
    audit = clone.parent / "audit.json"
    audit.unlink(missing_ok=True)  # the record of an earlier run proves nothing
    # A pytest of its own: none of this session's variables (xdist's worker, the current
    # test, PYTHONPATH) leak into it.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_") and k != "PYTHONPATH"}
    env.update(AUDIT_OUT=str(audit), DUMP_AFTER_S=str(CHILD_LIMIT_S))
    # Its temporary files under the clone's folder: pytest's numbered folders in /tmp are
    # shared with this session and others, and a pytest cleans old ones up at its exit.
    done = subprocess.run([sys.executable, "-c", PYTEST_WITH_AUDIT, "-p", "no:cacheprovider",
                           f"--basetemp={clone.parent / 'child-tmp'}", *args], cwd=clone,
                          env=env, capture_output=True, text=True, timeout=CHILD_LIMIT_S + 30)
    assert audit.exists(), f"pytest in the clone did not finish:\n{done.stderr[-6000:]}"
    return done, json.loads(audit.read_text())


def _inside(path: str, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def test_a_clone_collects_every_test_on_its_own(clone: Path) -> None:
    done, audit = _pytest_in(clone, "--collect-only", "-q")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = done.stdout.strip().splitlines()[-1]
    # pytest adds the time as H:MM:SS from a minute on (a slow machine, a loaded one).
    assert re.fullmatch(r"\d+ tests collected in [\d.]+s( \(\d+:\d\d:\d\d\))?", summary), summary
    # The clone's own code and tests ran, not this checkout's.
    assert all(_inside(f, clone) for f in audit["modules"].values()), audit["modules"]
    assert any(p.endswith("tests/vectors/chunking-v1.json") for p in audit["opened"])
    outside = [p for p in audit["opened"] if not _inside(p, clone)]
    assert not outside, f"the clone read files beside it: {outside}"


def test_a_clone_passes_the_chunking_vector_tests(clone: Path) -> None:
    done, audit = _pytest_in(clone, "-q", "tests/unit/test_chunking.py", "-k", "vector")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
    opened = audit["opened"]
    assert [p for p in opened if p.endswith("chunking-v1.json")], opened
    outside = [p for p in opened if not _inside(p, clone)]
    assert not outside, f"the clone read vectors beside it: {outside}"


def _check_shared(clone: Path, shared: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(clone / "scripts" / "check_shared.sh"), str(shared)],
                          capture_output=True, text=True, timeout=60)


def _fake_shared(clone: Path) -> Path:
    """A shared/ folder as the project's: the vectors and DESIGN.md of the clone's copies."""
    shared = clone.parent / "fake-shared"
    shutil.rmtree(shared, ignore_errors=True)
    shutil.copytree(clone / "tests" / "vectors", shared / "vectors")
    text = (clone / "docs" / "design.md").read_text()
    body = text.split("-->\n", 1)[1].removeprefix("\n")
    (shared / "DESIGN.md").write_text(body.replace("tests/vectors/", "../shared/vectors/"))
    return shared


def test_the_copies_equal_the_shared_folder_beside_this_checkout() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"no {SHARED} beside this checkout: nothing to compare the copies with")
    done = _check_shared(ROOT, SHARED)
    assert done.returncode == 0, done.stderr
    assert "agree with" in done.stdout


def test_check_shared_fails_loudly_on_a_changed_vector(clone: Path) -> None:
    shared = _fake_shared(clone)
    assert _check_shared(clone, shared).returncode == 0
    vector = shared / "vectors" / "erasure-v1.json"
    vector.write_bytes(vector.read_bytes().replace(b"\n", b"\r\n", 1))  # one byte more
    done = _check_shared(clone, shared)
    assert done.returncode == 1
    assert "tests/vectors/erasure-v1.json differs from" in done.stderr, done.stderr


def test_check_shared_fails_on_a_missing_vector_and_a_changed_contract(clone: Path) -> None:
    shared = _fake_shared(clone)
    (shared / "vectors" / "chunking-v2.json").write_text("{}\n")
    design = shared / "DESIGN.md"
    design.write_text(design.read_text().replace("`cdc:262144:1048576:4194304`",
                                                 "`cdc:262144:1048576:8388608`"))
    done = _check_shared(clone, shared)
    assert done.returncode == 1
    assert "tests/vectors/chunking-v2.json is missing" in done.stderr, done.stderr
    assert "docs/design.md differs from" in done.stderr and "8388608" in done.stderr


def test_no_document_points_outside_the_repository() -> None:
    """Docs, scripts and tests name what the repository holds, never ../shared/."""
    on_purpose = {"scripts/check_shared.sh", "tests/unit/test_clone.py"}  # they compare
    offenders = [name for name in _repository_files()
                 if name.endswith((".md", ".py", ".sh", ".toml")) and name not in on_purpose
                 and "../shared/" in (ROOT / name).read_text(errors="replace")]
    assert not offenders, f"these name ../shared/ instead of the repository's copies: {offenders}"
