#!/usr/bin/env bash
# Every 3- to 6-GPU subset of a DGX-1V: the members' bounds, the packed
# rings and the tree packing that `ferrocoll synth` simulates for an
# all-reduce of 1 GiB, as the table of docs/synthesis.md (subsets the
# machine's symmetries map onto each other share a row).
#   FERROCOLL_BIN=target/release/ferrocoll bash scripts/synth-dgx1-subsets.sh
set -euo pipefail
bin="${FERROCOLL_BIN:-target/release/ferrocoll}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -c '
import itertools
for k in (3, 4, 5, 6):
    for c in itertools.combinations(range(8), k):
        print(",".join(map(str, c)))' > "$work/subsets"
while read -r gpus; do
  out=$("$bin" synth --topo dgx1-v100 --gpus "$gpus" --op all-reduce --output "$work/s.json")
  # The NVLink-only line is absent when NVLink does not connect the members.
  nv=$(echo "$out" | awk '/NVLink only, members alone/ {print $(NF-1)}')
  ev=$(echo "$out" | awk '/every link, members alone/ {print $(NF-1)}')
  ring=$(echo "$out" | awk '/^# rings/ {r=1} r && /predicted: busbw/ {sub(/.*busbw /, ""); print $1; exit}')
  trees=$(echo "$out" | awk '/^# trees/ {t=1} t && /predicted: busbw/ {sub(/.*busbw /, ""); print $1; exit}')
  echo "$gpus ${nv:-0} $ev ${ring:-0} ${trees:-0}"
done < "$work/subsets" > "$work/rows"
python3 - "$work/rows" <<'PY'
import itertools, sys
# nvidia-smi topo -m of the preset: NVLink multiplicities; GPUs 2k, 2k+1
# share a PCIe switch, 0-3 and 4-7 a NUMA node.
M = [r.split() for r in """X NV1 NV1 NV2 NV2 SYS SYS SYS
NV1 X NV2 NV1 SYS NV2 SYS SYS
NV1 NV2 X NV2 SYS SYS NV1 SYS
NV2 NV1 NV2 X SYS SYS SYS NV1
NV2 SYS SYS SYS X NV1 NV1 NV2
SYS NV2 SYS SYS NV1 X NV2 NV1
SYS SYS NV1 SYS NV1 NV2 X NV2
SYS SYS SYS NV1 NV2 NV1 NV2 X""".split("\n")]
inv = lambda a, b: (M[a][b], a // 2 == b // 2, a // 4 == b // 4)
autos = [p for p in itertools.permutations(range(8))
         if all(inv(a, b) == inv(p[a], p[b]) for a in range(8) for b in range(8))]
classes = {}
for line in open(sys.argv[1]):
    g, nv, ev, ring, trees = line.split()
    s = tuple(map(int, g.split(",")))
    canon = min(tuple(sorted(p[x] for x in s)) for p in autos)
    classes.setdefault(canon, []).append(tuple(map(float, (nv, ev, ring, trees))))
span = lambda xs: f"{min(xs):.1f}" if max(xs) - min(xs) < 0.05 else f"{min(xs):.1f}–{max(xs):.1f}"
print(f"<!-- {len(autos)} automorphisms, {sum(map(len, classes.values()))} subsets, {len(classes)} classes -->")
print("| GPUs (one of the class) | subsets | bound, NVLink | bound, every link | best ring | trees | best / bound |")
print("|---|---|---|---|---|---|---|")
worst, below = 9.0, 0
for canon in sorted(classes, key=lambda c: (len(c), c)):
    vs = classes[canon]
    nv, ev = vs[0][0], vs[0][1]
    fr = [max(v[2], v[3]) / (v[0] if v[0] > 0 else v[1]) for v in vs]
    worst, below = min(worst, min(fr)), below + sum(f < 0.9 for f in fr)
    nvs = f"{nv:.0f}" if nv > 0 else "— (not connected)"
    print(f"| {','.join(map(str, canon))} | {len(vs)} | {nvs} | {ev:.0f} | "
          f"{span([v[2] for v in vs])} | {span([v[3] for v in vs])} | {min(fr):.2f} |")
print(f"\nWorst: {worst:.2f}; subsets below 0.9: {below} of {sum(map(len, classes.values()))}.")
PY
