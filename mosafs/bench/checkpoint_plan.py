"""The pure parts of `mosafs bench checkpoint` (mosafs.bench.checkpoint): the state dict's
shape, the subsets of tensors each step changes, the verdicts on the issue's targets and
the table; no torch, no cluster, so that unit tests check them alone."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20
VOCAB = 16384           # rows of an embedding: 64 MiB of float32 at hidden size 1024
REST_PIECE = 16 * MiB   # the bytes no layer fills, in tensors of at most this size
SMALL = 64 * 1024       # smaller tensors change with the next larger one in the file
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ST_DTYPES = {"float32": "F32", "bfloat16": "BF16"}  # safetensors' names
WARMUP_BYTES = 4 * MiB
# The issue's targets, for a 1 GiB state dict on a GPU with 10 % of it changed per step.
DEDUP_VS_LOCAL_MAX = 0.15   # blocking save / torch.save to the local disk
TO_HOST_SLACK = 1.1         # bytes_to_host <= 1.1 x bytes_sent + header
NONBLOCKING_MAX_S = 0.05    # save(blocking=False) returns within
ALL_NEW_VS_LOCAL_MAX = 1.0  # all-new steps: blocking save / torch.save to the local disk
LOAD_SPEED_MIN = 0.8        # load speed / safetensors.torch.load_file's, local disk
ISSUE_SIZE, ISSUE_CHANGED = 1024 * MiB, 0.10
UNCHANGED_CHUNKS_MIN = 0.90  # the condition of the dedup target: of the file's chunks


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPE_BYTES

    @property
    def nbytes(self) -> int:
        return DTYPE_BYTES[self.dtype] * math.prod(self.shape)


def _layer(i: int, h: int) -> list[TensorPlan]:
    """One transformer block at hidden size H: 4 H^2 float32 matrices, 8 H^2 and 4 H^2
    bfloat16 ones (4, 16 and 8 MiB at H = 1024), and three small vectors."""
    p = f"layers.{i:03d}."
    return [TensorPlan(p + "attention_norm.weight", (h,), "float32"),
            *(TensorPlan(p + f"attention.{w}.weight", (h, h), "float32")
              for w in ("wq", "wk", "wv", "wo")),
            TensorPlan(p + "attention.wo.bias", (h,), "float32"),
            TensorPlan(p + "ffn_norm.weight", (h,), "float32"),
            TensorPlan(p + "feed_forward.w13.weight", (8 * h, h), "bfloat16"),
            TensorPlan(p + "feed_forward.w2.weight", (h, 4 * h), "bfloat16")]


def plan_state(total: int) -> list[TensorPlan]:
    """Tensors adding up to TOTAL bytes (less under 4), shaped like a model's state dict."""
    h = 1024 if total >= 256 * MiB else 256
    big = VOCAB * h * 4
    embeddings = total >= 8 * big  # two of them, an eighth of the state dict at most
    specs = [TensorPlan("tok_embeddings.weight", (VOCAB, h), "float32")] if embeddings else []
    layer = sum(t.nbytes for t in _layer(0, h))
    for i in range(max(0, total - 2 * big * embeddings - 4 * h) // layer):
        specs += _layer(i, h)
    specs.append(TensorPlan("norm.weight", (h,), "float32"))
    if embeddings:
        specs.append(TensorPlan("output.weight", (VOCAB, h), "float32"))
    rest = (total - sum(t.nbytes for t in specs)) // 4
    for i, start in enumerate(range(0, rest, REST_PIECE // 4)):
        specs.append(TensorPlan(f"rest.{i:03d}.weight",
                                (min(REST_PIECE // 4, rest - start),), "float32"))
    return specs


def file_order(plan: Sequence[TensorPlan]) -> tuple[list[int], int]:
    """PLAN's indices in the order a safetensors file holds them (by dtype, then name),
    and the file's header bytes (its length prefix included)."""
    from mosafs.checkpoint.format import TensorSpec, layout

    found = layout([TensorSpec(t.name, ST_DTYPES[t.dtype], t.shape, t.nbytes) for t in plan])
    index = {t.name: i for i, t in enumerate(plan)}
    return [index[e.spec.name] for e in found.entries], len(found.header)


def change_groups(plan: Sequence[TensorPlan]) -> list[list[int]]:
    """Indices of PLAN in runs that change together: each tensor of at least SMALL bytes
    with the small ones just before it in the file; small ones at the end join the last.
    A norm changing alone would cost a whole chunk (1 MiB on average) for a few KiB, which
    no training step does (a layer's norms train with its matrices)."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i in file_order(plan)[0]:
        pending.append(i)
        if plan[i].nbytes >= SMALL:
            groups.append(pending)
            pending = []
    if pending and groups:
        groups[-1] += pending
    elif pending:
        groups.append(pending)
    return groups


def choose(sizes: Sequence[int], fraction: float, rng: random.Random) -> list[int]:
    """Indices (sorted) of a random subset whose SIZES add up to about FRACTION of the
    total: in a shuffled order, each is taken where it brings the sum closer to it."""
    target = fraction * sum(sizes)
    order = list(range(len(sizes)))
    rng.shuffle(order)
    taken: list[int] = []
    total = 0
    for i in order:
        if abs(total + sizes[i] - target) < abs(total - target):
            taken.append(i)
            total += sizes[i]
    return sorted(taken)


def changed_tensors(plan: Sequence[TensorPlan], fraction: float, rng: random.Random) -> list[int]:
    """Indices (sorted) of the tensors one step rewrites: about FRACTION of the bytes."""
    groups = change_groups(plan)
    sizes = [sum(plan[i].nbytes for i in g) for g in groups]
    return sorted(i for g in choose(sizes, fraction, rng) for i in groups[g])


def step_kinds(steps: int) -> list[str]:
    """The series: "first" (all new), STEPS - 1 "changed", "nonblocking", "all_new"."""
    return ["first", *["changed"] * (steps - 1), "nonblocking", "all_new"]


def step_rng(seed: int, step: int) -> random.Random:
    return random.Random(f"mosafs-bench-checkpoint/{seed}/{step}")


def ratio(a: float | None, b: float | None, digits: int | None = 3) -> float | None:
    return None if a is None or not b else a / b if digits is None else round(a / b, digits)


def _judge(values: Sequence[float | None], target: str, ok: Any,
           **figures: Any) -> dict[str, Any]:
    """A target over VALUES (one per step, unrounded): the worst; pass where OK holds for
    every one; None where there is none."""
    known = [v for v in values if v is not None]
    worst = (min if target.startswith(">") else max)(known, default=None)
    return {"value": _round(worst), "target": target,
            "pass": all(v is not None and ok(v) for v in values) if values else None,
            "values": [_round(v) for v in values], **figures}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def verdicts(steps: Sequence[dict[str, Any]], loads: dict[str, Any] | None, *,
             device: str, header_bytes: int) -> dict[str, Any]:
    """The issue's targets on a run's figures. "pass" is None where there is nothing to
    judge (no such step; bytes to the host where the tensors are on the host)."""
    dedup = [s for s in steps if s["kind"] == "changed"]
    new = [s for s in steps if s["kind"] in ("first", "all_new")]
    nb = [s["nonblocking"] for s in steps if s.get("nonblocking")]
    host = [{"step": s["step"], "bytes_to_host": s["bytes_to_host"],
             "limit_bytes": int(TO_HOST_SLACK * s["bytes_sent"]) + header_bytes}
            for s in dedup if device == "cuda"]
    speed = [ratio(loads["cold"]["local_s"], loads["cold"]["mosafs_s"], None)] if loads else []
    out = {
        "dedup_save_vs_torch_local": _judge(
            [ratio(s["save_blocking_s"], s["torch_save_local_s"], None) for s in dedup],
            f"<= {DEDUP_VS_LOCAL_MAX}", lambda v: v <= DEDUP_VS_LOCAL_MAX,
            steps=[s["step"] for s in dedup],
            unchanged_chunks=[s.get("unchanged_chunks") for s in dedup],
            note=_condition_note(dedup)),
        "dedup_bytes_to_host": _judge(
            [ratio(h["bytes_to_host"], h["limit_bytes"], None) for h in host],
            f"<= 1 (bytes_to_host / ({TO_HOST_SLACK} x bytes_sent + header))",
            lambda v: v <= 1.0, per_step=host, header_bytes=header_bytes,
            note=None if device == "cuda" else "tensors on the host: none copied from a GPU"),
        "nonblocking_return_s": _judge(
            [n["returned_s"] for n in nb], f"<= {NONBLOCKING_MAX_S} s",
            lambda v: v <= NONBLOCKING_MAX_S, total_s=[n["total_s"] for n in nb]),
        "all_new_save_vs_torch_local": _judge(
            [ratio(s["save_blocking_s"], s["torch_save_local_s"], None) for s in new],
            f"<= {ALL_NEW_VS_LOCAL_MAX}", lambda v: v <= ALL_NEW_VS_LOCAL_MAX,
            steps=[s["step"] for s in new]),
        "load_speed_vs_safetensors_local": _judge(
            speed, f">= {LOAD_SPEED_MIN}", lambda v: v >= LOAD_SPEED_MIN,
            note="safetensors.torch.load_file seconds / mosafs.checkpoint.load seconds, "
                 "cold"),
    }
    judged = [t["pass"] for t in out.values() if t["pass"] is not None]
    return {**out, "pass": all(judged) if judged else None}


def _condition_note(dedup: Sequence[dict[str, Any]]) -> str | None:
    """The issue's condition for the dedup target is 90 % of the chunks unchanged; a
    step rewriting 10 % of the bytes in whole tensors leaves fewer (the chunks across each
    changed tensor's ends are new too): say so where a step missed it."""
    short = [s["step"] for s in dedup
             if s.get("unchanged_chunks") is not None
             and s["unchanged_chunks"] < UNCHANGED_CHUNKS_MIN]
    if not short:
        return None
    return (f"steps {short} left fewer than {UNCHANGED_CHUNKS_MIN:.0%} of their chunks "
            f"unchanged (the issue's condition); --changed sets the bytes rewritten")


def format_table(result: dict[str, Any]) -> str:
    """The human summary: a line per step, the loads, the verdicts."""
    p = result["params"]
    lines = [f"{result['benchmark']}: {p['state_dict_bytes'] / MiB:.0f} MiB state dict, "
             f"{p['tensors']} tensors on {p['device']}, {p['changed']:.0%} changed per step",
             "", f"{'step':>4} {'kind':<11} {'changed':>7} {'save s':>7} {'total s':>7} "
             f"{'local s':>7} {'mount s':>7} {'ratio':>6} {'hashed':>7} {'to host':>7} "
             f"{'sent':>7}  (MiB)"]
    for r in result["steps"]:
        lines.append(
            f"{r['step']:>4} {r['kind']:<11} {r['changed_fraction']:>7.1%} "
            f"{num(r['save_blocking_s']):>7} {num(r['total_s']):>7} "
            f"{num(r['torch_save_local_s']):>7} {num(r['torch_save_mount_s']):>7} "
            f"{num(r['ratio_vs_local']):>6} {r['bytes_hashed'] / MiB:>7.1f} "
            f"{r['bytes_to_host'] / MiB:>7.1f} {r['bytes_sent'] / MiB:>7.1f}")
        if r.get("nonblocking"):
            nb = r["nonblocking"]
            lines.append(f"     non-blocking: returned in {nb['returned_s']:.4f}s, saved in "
                         f"{nb['total_s']:.3f}s")
    loads = result.get("loads") or {}
    lines += [f"load {kind}: mosafs {loads[kind]['mosafs_s']:.3f}s, safetensors local "
              f"{loads[kind]['local_s']:.3f}s" for kind in ("cold", "warm") if kind in loads]
    if loads:
        lines.append(f"page cache dropped before cold loads: {loads['page_cache_dropped']}")
    lines.append("")
    verdict = {True: "PASS", False: "FAIL", None: "n/a"}
    lines += [f"{name}: {num(t['value'])} (target {t['target']}) {verdict[t['pass']]}"
              for name, t in result["targets"].items() if name != "pass"]
    lines.append(f"overall: {verdict[result['targets']['pass']]}")
    return "\n".join(lines)


def num(x: float | None) -> str:
    """X for a table or a progress line (- where there is none)."""
    return "-" if x is None else f"{x:.3f}" if x < 10 else f"{x:.1f}"
