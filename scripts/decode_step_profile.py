#!/usr/bin/env python3
"""Per-kernel profile of the LLM engine's decode steps, from the trace `gpulab diagnose` writes.

    gpulab diagnose --out d -- gpulab bench llm --config llama2-7b --dummy-weights --batch 16 \
        --input 128 --output 64 --prefill 0
    scripts/decode_step_profile.py d/trace.json

A decode step is a CUDA graph launch (a run of consecutive cudaGraphLaunch calls, if the step is
several graphs); the kernels its launches' correlation ids name are the step. The steps of the
largest kernel count are kept (one batch setting's decode steps), the first three dropped. Prints
the step's wall time (one step's first kernel to the next step's), the graph's span, the GPU
gap between graphs and what runs in it, then the layer: the repeating run of kernel names, each
kernel's median duration and median "added" time (its end past the previous kernel's end, which
is what it costs the step when launches overlap), and the kernels outside the layers.

Caveat (H200, session 12): under CUPTI a graph launch costs the host about 0.65-0.8 us a kernel
node, and the GPU waits for it; without CUPTI the 7B decode graph took 7-13 us at batches 1 and 8
and 49-64 us at 16. So the gap between graphs here is far above the untraced one (26-33 us).
"""
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    doc = json.load(open(path))
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def decode_steps(events):
    """{first launch's correlation: [(start, end, name)] of the step's kernels}, and every GPU activity."""
    api = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    step_of, run = {}, None
    for e in api:
        if "GraphLaunch" in e["name"]:
            run = run if run is not None else e["args"].get("correlation")
            step_of[e["args"].get("correlation")] = run
        else:
            run = None
    steps, gpu = defaultdict(list), []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        gpu.append((e["ts"], e["ts"] + e["dur"], e["name"]))
        if e["cat"] == "kernel" and e["args"].get("correlation") in step_of:
            steps[step_of[e["args"]["correlation"]]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    return steps, sorted(gpu)


def layer_period(names):
    """(first ordinal, kernels a layer) of the repeating run of kernel names, or None."""
    for period in range(2, 40):
        for head in range(0, 6):
            if names[head:head + period] == names[head + period:head + 2 * period]:
                return head, period
    return None


def short(name):
    return name.replace("void ", "")[:70]


def main(path):
    steps, gpu = decode_steps(load(path))
    if not steps:
        sys.exit(f"{path}: no graph launches with kernels (was the engine's decode step captured?)")
    keys = sorted(steps, key=lambda c: min(k[0] for k in steps[c]))
    n = max(len(steps[c]) for c in keys)
    keys = [c for c in keys if len(steps[c]) == n][3:]
    if len(keys) < 2:
        sys.exit(f"{path}: fewer than 5 decode steps of {n} kernels")
    med = statistics.median
    walls, spans, gaps, between = [], [], [], []
    per_ordinal = defaultdict(lambda: ([], []))  # ordinal -> (durations, added)
    for i, c in enumerate(keys):
        ks = sorted(steps[c])
        spans.append(ks[-1][1] - ks[0][0])
        prev_end = ks[0][0]
        for j, (start, end, _) in enumerate(ks):
            per_ordinal[j][0].append(end - start)
            per_ordinal[j][1].append(end - prev_end)
            prev_end = max(prev_end, end)
        if i + 1 < len(keys):
            nxt = min(k[0] for k in steps[keys[i + 1]])
            walls.append(nxt - ks[0][0])
            gaps.append(nxt - ks[-1][1])
            between.append([(round(s - ks[-1][1], 1), round(e - s, 1), name[:40]) for s, e, name in gpu
                            if s >= ks[-1][1] and e <= nxt])
    print(f"decode steps: {len(keys)}, {n} kernels each")
    print(f"step wall {med(walls):.1f} us, graph span {med(spans):.1f} us; between graphs {med(gaps):.1f} us "
          f"(min {min(gaps):.1f}, max {max(gaps):.1f})")
    print("  GPU work between two graphs (offset us, duration us, name):", between[len(between) // 2])
    names = [k[2] for k in sorted(steps[keys[0]])]
    found = layer_period(names)
    head, period = found if found else (0, n)
    layers = (n - head) // period if found else 1
    print(f"layer: {period} kernels from ordinal {head}, {layers} layers; median us: duration, added")
    total_dur = total_added = 0.0
    for j in range(period):
        dur = med([x for layer in range(layers) for x in per_ordinal[head + layer * period + j][0]])
        added = med([x for layer in range(layers) for x in per_ordinal[head + layer * period + j][1]])
        total_dur += dur
        total_added += added
        print(f"  {dur:7.2f} {added:7.2f}  {short(names[head + j])}")
    print(f"  {total_dur:7.2f} {total_added:7.2f}  a layer")
    print("outside the layers:")
    for j in list(range(head)) + list(range(head + layers * period, n)):
        print(f"  {med(per_ordinal[j][0]):7.2f} {med(per_ordinal[j][1]):7.2f}  {short(names[j])}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
