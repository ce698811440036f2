"""The rebuild benchmark's arithmetic (mosafs.bench.ec_rebuild): the comparison of the
6-survivor case with the 2-survivor one is by rate, since random placement gives the dead
benefactor its share only on average."""

from __future__ import annotations

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
