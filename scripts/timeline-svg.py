#!/usr/bin/env python3
"""Draw a ferrocoll timeline (FERROCOLL_TIMELINE, a Chrome trace) as SVG:
one lane per thread, gradient buckets and collective calls as bars, the
last WINDOW_MS of the trace.

    scripts/timeline-svg.py TRACE.json OUT.svg [WINDOW_MS]
"""
import json
import sys

trace, out = sys.argv[1], sys.argv[2]
window_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
events = json.load(open(trace))
names = {(e["pid"], e["tid"]): e["args"]["name"]
         for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
# Pair B/E per thread (they nest), keep buckets and calls.
bars, stacks = [], {}
for e in events:
    key = (e.get("pid"), e.get("tid"))
    if e.get("ph") == "B":
        stacks.setdefault(key, []).append(e)
    elif e.get("ph") == "E" and stacks.get(key):
        b = stacks[key].pop()
        if b["name"] in ("bucket", "collective"):
            bars.append((key, b["name"], b["ts"], e["ts"], b["args"], len(stacks[key])))
end = max(b[3] for b in bars)
start = end - window_ms * 1000
# Buckets first, so the calls inside them are drawn on top.
bars = sorted((b for b in bars if b[3] >= start), key=lambda b: b[1] != "bucket")
lanes = sorted({b[0] for b in bars})
width, lane_h, left = 1000, 34, 210
scale = (width - left - 10) / (end - start)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
       f'height="{lane_h * len(lanes) + 50}" font-family="sans-serif" font-size="12">',
       '<rect width="100%" height="100%" fill="white"/>']
for i, lane in enumerate(lanes):
    y = 10 + i * lane_h
    label = f'{names.get(lane, "thread")} (pid {lane[0]})'
    svg.append(f'<text x="4" y="{y + 20}">{label}</text>')
for lane, name, b, e, args, depth in bars:
    y = 10 + lanes.index(lane) * lane_h + (4 if name == "bucket" else 14)
    x = left + (max(b, start) - start) * scale
    w = max((e - max(b, start)) * scale, 0.5)
    color = "#9ecae1" if name == "bucket" else "#e6550d"
    h = 26 if name == "bucket" else 12
    title = f'{name} {args}'
    svg.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h}" fill="{color}">'
               f'<title>{title}</title></rect>')
y = 10 + len(lanes) * lane_h + 20
svg.append(f'<text x="{left}" y="{y}">last {window_ms:g} ms; light: gradient bucket; '
           'dark: its all-reduce (ferrocoll collective span)</text>')
svg.append('</svg>')
open(out, "w").write("\n".join(svg))
print(f"{len(bars)} bars on {len(lanes)} lanes -> {out}")
