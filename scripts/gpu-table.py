#!/usr/bin/env python3
"""The table scripts/gpu-check.sh ends with, from the bench's JSON rows in
the folder given: all-reduce busbw of ferrocoll's CUDA executor and NCCL
against the device's copy bound BW*(K-1)/K^2 (K ranks on one GPU; BW the
copy's read+write rate measured in the same run), and small-call device
time against NCCL's with one rank. Markdown, for docs/benchmarks.md."""
import json
import os
import sys

# What the simulator assumes until this check measures it
# (crates/topo/src/sim/cost.rs: GPU_BLOCK_GBPS, GPU_INSTRUCTION_US; a test
# in tests/gpu_check.rs keeps the two files equal).
ASSUMED_BLOCK_GBPS = 100.0
ASSUMED_INSTRUCTION_US = 1.0


def load(folder, name):
    try:
        with open(os.path.join(folder, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def rows(report, nccl):
    return [r for r in report["rows"] if (r["algorithm"] == "nccl") == nccl]


def busbw(row, mode="out_of_place"):
    m = row.get(mode)
    return m["busbw"] if m else None


def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def bandwidth(folder):
    print("| K | size | BW·(K−1)/K² | ours busbw (out / in place) | ours / bound | NCCL busbw | NCCL / bound | ours / NCCL |")
    print("|---|---|---|---|---|---|---|---|")
    for k in (1, 2, 4, 8):
        report = load(folder, f"bw-{k}.json")
        if not report:
            print(f"| {k} | (no run) | | | | | | |")
            continue
        bw = (report.get("memory_bandwidth") or {}).get("best")
        nccl = {r["size"]: r for r in rows(report, True)}
        for r in rows(report, False):
            size = r["size"]
            if k == 1:
                # One rank: a copy; its algbw is bounded by BW/2.
                bound = bw / 2 if bw else None
                ours = r["out_of_place"]["algbw"] if r.get("out_of_place") else None
                theirs = nccl[size]["out_of_place"]["algbw"] if size in nccl and nccl[size].get("out_of_place") else None
                label = "algbw vs BW/2"
            else:
                bound = bw * (k - 1) / k / k if bw else None
                ours, theirs = busbw(r), busbw(nccl[size]) if size in nccl else None
                label = ""
            ratio = lambda x: x / bound if x and bound else None
            both = f"{fmt(ours)} / {fmt(busbw(r, 'in_place'))}"
            print(
                f"| {k} | {size >> 20} MiB {label}| {fmt(bound)} | {both} | {fmt(ratio(ours), '{:.2f}')} "
                f"| {fmt(theirs)} | {fmt(ratio(theirs), '{:.2f}')} | {fmt(ours / theirs if ours and theirs else None, '{:.2f}')} |"
            )


def small_calls(folder):
    nccl1 = load(folder, "lat-simple-1.json")
    base = {r["size"]: r["out_of_place"]["time_us"] for r in rows(nccl1, True)} if nccl1 else {}
    print()
    print("| K | size | ours Simple µs | ours LL µs | NCCL µs | best of ours / NCCL K=1 |")
    print("|---|---|---|---|---|---|")
    for k in (1, 2, 8):
        simple, ll = load(folder, f"lat-simple-{k}.json"), load(folder, f"lat-ll-{k}.json")
        if not simple and not ll:
            print(f"| {k} | (no run) | | | | |")
            continue
        # Either file alone still makes rows: a step that failed or ran out
        # of time loses its own column, not the other's.
        t = lambda rep, nccl: {r["size"]: r["out_of_place"]["time_us"] for r in rows(rep, nccl) if r.get("out_of_place")} if rep else {}
        ours_s, ours_l, theirs = t(simple, False), t(ll, False), t(simple, True)
        for size in sorted(set(ours_s) | set(ours_l)):
            best = min(x for x in (ours_s.get(size), ours_l.get(size)) if x is not None)
            ratio = best / base[size] if size in base and base[size] else None
            print(
                f"| {k} | {size} B | {fmt(ours_s.get(size))} | {fmt(ours_l.get(size))} "
                f"| {fmt(theirs.get(size))} | {fmt(ratio, '{:.2f}')} |"
            )


def instructions(folder, k):
    """Instructions one rank runs: the plan's total over its ranks."""
    try:
        with open(os.path.join(folder, f"cal-instructions-{k}.txt")) as f:
            return int(f.read().split()[0]) / k
    except (OSError, ValueError, IndexError):
        return None


def calibration(folder):
    block = None
    report = load(folder, "cal-block.json")
    ours = rows(report, False) if report else []
    if ours and ours[0].get("out_of_place"):
        # A copy: every byte loaded once and stored once.
        block = 2 * ours[0]["out_of_place"]["algbw"]
    times = {}
    for k in (1, 8):
        rep = load(folder, f"cal-ins-{k}.json")
        mine = [r for r in rows(rep, False) if r.get("out_of_place")] if rep else []
        times[k] = mine[0]["out_of_place"]["time_us"] if mine else None
    i1, i8 = instructions(folder, 1), instructions(folder, 8)
    per = None
    if times[1] is not None and times[8] is not None and i1 is not None and i8 is not None and i8 > i1:
        per = (times[8] - times[1]) / (i8 - i1)
    print()
    print("| simulator parameter | measured | assumed | from |")
    print("|---|---|---|---|")
    print(f"| gpu_block_gbps (GB/s loaded + stored by one block) | {fmt(block)} | {ASSUMED_BLOCK_GBPS:.1f} | 1 rank, 1 channel, 256 MiB: 2 × algbw |")
    how = f"1 channel, 8 B: ({fmt(times[8], '{:.2f}')} − {fmt(times[1], '{:.2f}')} µs) over ({fmt(i8, '{:.0f}')} − {fmt(i1, '{:.0f}')}) instructions per rank"
    print(f"| gpu_instruction_us (µs per instruction) | {fmt(per, '{:.2f}')} | {ASSUMED_INSTRUCTION_US:.2f} | {how} |")


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu-check-json"
    bandwidth(folder)
    small_calls(folder)
    calibration(folder)
