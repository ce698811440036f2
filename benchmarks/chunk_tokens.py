"""The CPU cost of chunk access tokens, in process (docs/benchmarks.md, "The cost of chunk
access tokens"): what the manager spends signing a block-map's read tokens, and what a
benefactor spends checking one token per GetChunk or PutChunk, against the BLAKE3 hash of
one chunk of the default chunker's average size (1 MiB), which every put and every read
pays anyway.

    .venv/bin/python benchmarks/chunk_tokens.py [--chunks 100000]

Prints one JSON object: microseconds per token signed and checked, per MiB hashed, and
the check's share of the hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import blake3

from mosafs.benefactor.tokens import TokenChecker
from mosafs.manager.tokens import TokenAuthority

MiB = 1 << 20


def best_us(fn, count: int, repeat: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Microseconds per call of FN() (which does COUNT operations), best of REPEAT."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=100_000)
    args = parser.parse_args()
    holder = hashlib.sha256(b"a client certificate").digest()
    ids = [hashlib.sha256(i.to_bytes(8, "big")).digest() for i in range(args.chunks)]
    authority = TokenAuthority()
    checker = TokenChecker(required=True)
    checker.update((k.id, k.secret, k.not_after_ms) for k in authority.published())
    tokens = authority.read_tokens(ids, holder)
    write = authority.write_token(1, holder)
    data = os.urandom(MiB)

    def check_reads() -> None:
        for cid, token in zip(ids, tokens, strict=True):
            checker.check_read(token, cid, holder)

    def check_writes() -> None:
        for _ in range(args.chunks):
            checker.check_write(write, holder)

    hash_us = best_us(lambda: blake3.blake3(data).digest(), 1, repeat=20)
    out = {
        "sign_read_us": round(best_us(lambda: authority.read_tokens(ids, holder),
                                      args.chunks), 3),
        "check_read_us": round(best_us(check_reads, args.chunks), 3),
        "check_write_us": round(best_us(check_writes, args.chunks), 3),
        "blake3_1mib_us": round(hash_us, 1),
    }
    out["check_share_of_1mib_hash_pct"] = round(100 * out["check_read_us"] / hash_us, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
