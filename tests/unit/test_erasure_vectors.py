"""Erasure code v1 (DESIGN §10): every coder reproduces every case of erasure-v1.json.

For each case: the chunk is blake3(seed).digest(length); the BLAKE3 of every fragment
(K data then M parity) must match, and decoding after erasing the case's fragments must
give back bytes whose BLAKE3 is the chunk id (rebuilding the erased ones gives them back
bit for bit). The GPU coder is marked `gpu` and skips, with the reason, without one;
ISA-L is checked both as the system library and as pyeclib's bundled copy when present.
"""

from __future__ import annotations

import json
from typing import Any

import blake3
import pytest

from mosafs.erasure import CODER_NAMES, Code, Coder, fragment_size, make_coder
from mosafs.erasure.isal import IsalCoder, load_isal, pyeclib_library, system_library
from mosafs.erasure.registry import coder_unavailable_reason
from tests.conftest import ERASURE_VECTORS

VECTORS: dict[str, Any] = json.loads(ERASURE_VECTORS.read_text())
CASES: list[dict[str, Any]] = VECTORS["cases"]


def _coder_param(name: str) -> Any:
    reason = coder_unavailable_reason(name)
    marks = [pytest.mark.skipif(reason is not None, reason=f"{name} coder unavailable: {reason}")]
    if name == "gpu":
        marks.insert(0, pytest.mark.gpu)
    return pytest.param(name, marks=marks, id=name)


def _library_param(which: str, found: str | None) -> Any:
    return pytest.param(which, id=f"isal-{which}", marks=pytest.mark.skipif(
        found is None, reason=f"no {which} ISA-L library here"))


@pytest.fixture(scope="module", params=[_coder_param(n) for n in CODER_NAMES])
def coder(request: pytest.FixtureRequest) -> Coder:
    return make_coder(request.param)


@pytest.fixture(scope="module", params=[_library_param("system", system_library()),
                                        _library_param("pyeclib", pyeclib_library())])
def isal_coder(request: pytest.FixtureRequest) -> Coder:
    return IsalCoder(load_isal(request.param))


def chunk_of(case: dict[str, Any]) -> bytes:
    data = blake3.blake3(case["seed"].encode()).digest(length=case["length"])
    assert blake3.blake3(data).hexdigest() == case["chunk_id"], "vector input recipe changed"
    return data


def hexes(buffers: list[Any]) -> list[str]:
    return [blake3.blake3(b).hexdigest() for b in buffers]


def case_id(case: dict[str, Any]) -> str:
    return f"{case['k']}+{case['m']}-{case['length']}"


def test_vectors_cover_the_contract() -> None:
    """The file is the v1 contract and spans what the coders must handle: K up to 12,
    M up to 4, a 1-byte chunk, lengths that are not multiples of 64 K."""
    assert VECTORS["spec"] == "mosafs erasure v1"
    assert "0x11D" in VECTORS["field"]
    assert len(CASES) >= 10
    assert 1 in {c["length"] for c in CASES} and 64 in {c["fragment_size"] for c in CASES}
    assert any(c["length"] % (64 * c["k"]) for c in CASES)
    assert max(c["k"] for c in CASES) >= 12 and max(c["m"] for c in CASES) >= 4


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fragment_size_matches(case: dict[str, Any]) -> None:
    assert fragment_size(case["length"], case["k"]) == case["fragment_size"]
    lay = Code(case["k"], case["m"]).layout(case["length"])
    assert lay.padded_length == case["k"] * case["fragment_size"] >= case["length"]
    assert len(case["fragments"]) == case["k"] + case["m"]
    assert len(case["erase"]) == case["m"]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fragments_match(coder: Coder, case: dict[str, Any]) -> None:
    data = chunk_of(case)
    k, m = case["k"], case["m"]
    frags = coder.fragments(data, k, m)
    assert [len(f) for f in frags] == [case["fragment_size"]] * (k + m)
    assert hexes(frags) == case["fragments"]
    assert hexes(list(coder.encode(data, k, m))) == case["fragments"][k:]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decode_after_erasure(coder: Coder, case: dict[str, Any]) -> None:
    data = chunk_of(case)
    k, m = case["k"], case["m"]
    frags = coder.fragments(data, k, m)
    kept = {i: bytes(f) for i, f in enumerate(frags) if i not in case["erase"]}
    decoded = coder.decode(kept, k, m, case["length"])
    assert len(decoded) == case["length"]
    assert blake3.blake3(decoded).hexdigest() == case["chunk_id"]
    rebuilt = coder.rebuild(kept, k, m, case["erase"])
    assert list(rebuilt) == sorted(case["erase"])
    assert hexes(list(rebuilt.values())) == [case["fragments"][i] for i in sorted(case["erase"])]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_isal_library(isal_coder: Coder, case: dict[str, Any]) -> None:
    """The system's libisal and pyeclib's copy are both the code of DESIGN §10."""
    data = chunk_of(case)
    k, m = case["k"], case["m"]
    assert hexes(isal_coder.fragments(data, k, m)) == case["fragments"]
    kept = {i: f for i, f in enumerate(isal_coder.fragments(data, k, m))
            if i not in case["erase"]}
    assert blake3.blake3(isal_coder.decode(kept, k, m, len(data))).hexdigest() == case["chunk_id"]
