"""POSIX permission bits as both the manager's checks and a mount's cached answers read
them (mosafs.capability.posix_allows)."""

from __future__ import annotations

from mosafs.capability import R, W, X, posix_allows


def test_owner_group_and_others_each_get_their_own_bits() -> None:
    mode = 0o751  # owner rwx, group r-x, others --x
    assert posix_allows(10, (10,), 10, 20, mode, R | W | X, directory=True)
    assert posix_allows(11, (20,), 10, 20, mode, R | X, directory=True)
    assert not posix_allows(11, (20,), 10, 20, mode, W, directory=True)
    assert posix_allows(12, (30,), 10, 20, mode, X, directory=True)
    assert not posix_allows(12, (30,), 10, 20, mode, R, directory=True)
    # The owner's bits decide for the owner, even when the group's would allow more.
    assert not posix_allows(10, (20,), 10, 20, 0o070, R, directory=True)


def test_root_passes_all_but_executing_a_file_without_an_x_bit() -> None:
    assert posix_allows(0, (0,), 10, 20, 0o000, R | W | X, directory=True)
    assert not posix_allows(0, (0,), 10, 20, 0o644, X, directory=False)
    assert posix_allows(0, (0,), 10, 20, 0o744, X, directory=False)
