"""Which failures of a write pipeline are domain errors (EIO for the file, quietly) and
which are bugs (logged with a traceback)."""

from __future__ import annotations

from mosafs import errors
from mosafs.errors import domain_error


def test_unit_domain_error_unwraps_groups_of_domain_errors():
    first = errors.Unavailable("manager gone")
    group = ExceptionGroup("uploads", [first, errors.Unavailable("again")])
    assert domain_error(group) is first
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [first])])
    assert domain_error(nested) is first
    assert domain_error(first) is first


def test_unit_domain_error_calls_anything_else_a_bug():
    assert domain_error(ValueError("x")) is None
    assert domain_error(ExceptionGroup("mixed", [errors.Unavailable("u"), KeyError("k")])) is None
