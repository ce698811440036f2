"""Late binding of rebuilds (mosafs.manager.ec_plans.rebound): a rebuild whose links are
busy when its turn comes starts with other benefactors whose links are free, the same
repair (the same slots, sources among the readable fragments, targets among those that
could take them when it was planned)."""

from __future__ import annotations

import random
from collections import Counter

from mosafs.manager.ec_plans import REBUILD, Plan, fits, mixing, rebound
from mosafs.manager.metadata import FragmentMove, Layout

IDS = tuple(bytes([i]) * 32 for i in range(3))


def rebuild(worker: str, target: str, spare: tuple[str, ...]) -> Plan:
    """ec:2+1, fragment 2 lost with dead b9: fragments 0 and 1 on b0 and b1."""
    return Plan(b"c" * 32, REBUILD, worker, "p", 1000, read_bytes=512, store_bytes=512,
                moves=(FragmentMove(2, IDS[2], "b9", target),), expect=Layout(2, 1, IDS),
                fragments=((0, "b0"), (1, "b1")), spare=spare)


def test_a_busy_target_is_replaced_by_a_free_spare() -> None:
    p = rebuild("b0", "b2", ("b3", "b4"))
    sending: Counter[str] = Counter()
    receiving = Counter({"b2": 2, "b0": 2, "b3": 1})
    assert not fits(p, sending, receiving, 2)
    q = rebound(p, lambda x: fits(x, sending, receiving, 2), sending, receiving)
    assert q is not None and fits(q, sending, receiving, 2)
    # b0 and b2 may not receive: the rebuilder is b1 (its own fragment local, reads b0's)
    # or the free spare b4 (reads both); the target the idlest of the spares.
    assert q.moves[0].holder == "b4" and q.moves[0].index == 2 and q.moves[0].fid == IDS[2]
    assert {t for s, t in q.transfers()} <= {"b1", "b4"}
    assert q.worker in {"b1", "b4"} and q.cid == p.cid and q.expect == p.expect
    # The spares are the rest of the candidates, the old target among them.
    assert set(q.spare) == {"b2", "b3"}
    # Bytes read from peers: one fragment of 512 bytes if the rebuilder holds the other.
    assert q.read_bytes == (512 if q.worker == "b1" else 1024)
    if q.worker == "b1":
        assert q.fragments[0] == (1, "b1")


def test_busy_senders_are_read_around_when_more_fragments_are_readable() -> None:
    # ec:1+2 with fragment 2 lost: either of the two others rebuilds it.
    p = Plan(b"c" * 32, REBUILD, "b2", "p", 1000, read_bytes=1024, store_bytes=1024,
             moves=(FragmentMove(2, IDS[2], "b9", "b2"),), expect=Layout(1, 2, IDS),
             fragments=((0, "b0"), (1, "b1")), spare=("b3",))
    sending = Counter({"b0": 2})
    receiving: Counter[str] = Counter()
    assert not fits(p, sending, receiving, 2)  # planned to read b0's
    q = rebound(p, lambda x: fits(x, sending, receiving, 2), sending, receiving)
    assert q is not None and all(s != "b0" for s, _ in q.transfers())
    assert q.fragments[0] == (1, "b1") and q.moves[0].holder in {"b2", "b3"}


def test_nothing_starts_while_every_choice_is_busy() -> None:
    p = rebuild("b0", "b2", ("b3",))
    sending = Counter({"b0": 2, "b1": 2})  # both sources busy: every rebuild needs one
    receiving: Counter[str] = Counter()
    assert rebound(p, lambda x: fits(x, sending, receiving, 2), sending, receiving) is None
    # Without spares a plan is not bound again (moves of live fragments, conversions).
    assert rebound(rebuild("b0", "b2", ()), lambda x: True, sending, receiving) is None


def one_sender(sender: str, pool: tuple[str, ...], cid: bytes = b"c" * 32) -> Plan:
    """ec:1+1, fragment 1 lost with dead b9: its only other fragment on SENDER, so SENDER
    sends it to one of POOL (the rebuilder SENDER or the target reading from it)."""
    return Plan(cid, REBUILD, sender, "p", 1000, read_bytes=0, store_bytes=1024,
                moves=(FragmentMove(1, IDS[1], "b9", pool[0]),), expect=Layout(1, 1, IDS[:2]),
                fragments=((0, sender),), spare=pool[1:])


def test_a_sender_keeps_to_the_receiver_it_already_sends_to() -> None:
    # b0 sends to b1 (one transfer of two slots); b2 and b3 are idle. Sending the next
    # fragment to b1 keeps b0's link one connection to one peer, as two survivors' links
    # are; b2 and b3 stay free for the other senders.
    sending = Counter({"b0": 1})
    receiving = Counter({"b1": 1})
    pairs = Counter({("b0", "b1"): 1})
    p = one_sender("b0", ("b2", "b3", "b1"))
    q = rebound(p, lambda x: fits(x, sending, receiving, 2), sending, receiving, pairs)
    assert q is not None and q.transfers() == [("b0", "b1")]
    # Without the pairs, the idlest receiver wins, and b0's link carries two peers.
    q = rebound(p, lambda x: fits(x, sending, receiving, 2), sending, receiving)
    assert q is not None and q.transfers()[0][1] in {"b2", "b3"}


def test_of_two_receivers_as_busy_the_one_another_sender_feeds_is_avoided() -> None:
    # b2 receives from b5, b4 from b0 itself, one transfer each: b0's next fragment goes
    # to b4 (its link and b4's carry b0's connection only), not to b2 (b2's would carry
    # two senders' connections, competing).
    sending = Counter({"b0": 1, "b5": 1})
    receiving = Counter({"b2": 1, "b4": 1})
    pairs = Counter({("b5", "b2"): 1, ("b0", "b4"): 1})
    p = one_sender("b0", ("b2", "b4"))
    q = rebound(p, lambda x: fits(x, sending, receiving, 2), sending, receiving, pairs)
    assert q is not None and q.transfers() == [("b0", "b4")]
    q = rebound(p, lambda x: fits(x, sending, receiving, 2), sending, receiving)
    assert q is not None and q.transfers() == [("b0", "b2")]  # as busy: the planned one


def _score(q: Plan, sending: Counter[str], receiving: Counter[str],
           pairs: Counter[tuple[str, str]]) -> tuple[int, int, int]:
    busiest = [sending[s] for s, _ in q.transfers()] + [receiving[r] for _, r in q.transfers()]
    return (max(busiest, default=0), mixing(q.transfers(), sending, receiving, pairs),
            sum(busiest))


def test_the_per_link_shortcut_loses_no_choice() -> None:
    """With PER_LINK, rebound refuses at once a plan that fewer than K holders could send
    for, and leaves out targets whose link in is full: on random loads it finds a plan
    whenever the full search does, one at least as good, and never one that cannot start."""
    rng = random.Random(7)
    bids = [f"b{i}" for i in range(12)]
    found = 0
    for _ in range(600):
        k, m = rng.choice([(1, 1), (2, 1), (4, 2)])
        members = rng.sample(bids, k + m - 1)
        rest = [b for b in bids if b not in members]
        ids = tuple(bytes([i]) * 32 for i in range(k + m))
        p = Plan(b"c" * 32, REBUILD, members[0], "p", 4096, read_bytes=0, store_bytes=512,
                 moves=(FragmentMove(k + m - 1, ids[-1], "b99", rest[0]),),
                 expect=Layout(k, m, ids), fragments=tuple(enumerate(members)),
                 spare=tuple(rest[1:]))
        sending = Counter({b: rng.choice([0, 0, 1, 2]) for b in bids})
        receiving = Counter({b: rng.choice([0, 0, 1, 2]) for b in bids})
        pairs: Counter[tuple[str, str]] = Counter()

        def may(x: Plan, sending: Counter[str] = sending,
                receiving: Counter[str] = receiving) -> bool:
            return fits(x, sending, receiving, 2)

        full = rebound(p, may, sending, receiving, pairs)
        quick = rebound(p, may, sending, receiving, pairs, 2)
        if full is None and quick is None:
            continue
        found += 1
        assert quick is not None and may(quick), (full, quick)
        if full is not None:
            assert _score(quick, sending, receiving, pairs) <= \
                _score(full, sending, receiving, pairs)
    assert found > 100
