#!/usr/bin/env bash
# PyTorch programs with planted pathologies (examples/pytorch/), diagnosed from their profiler
# traces. Run on the GPU machine from the repository root:
#   scripts/pytorch_traces.sh [GPULAB]
# Without GPULAB, builds (or brings up to date) build-device/ with scripts/device.sh --no-tests and
# uses build-device/src/cli/gpulab.
# For each program: runs it with --trace into $OUT/traces/<name>.json (torch.profiler, Kineto
# JSON), runs `gpulab diagnose --trace` on it (findings in $OUT/findings/<name>.json), and runs the
# unprofiled program under gpulab's own CUPTI tracer (`gpulab diagnose -- python3 ...`, findings in
# $OUT/native/<name>.json). Prints one table: program, planted rule, top finding from the Kineto
# trace, match, top finding from gpulab's tracer (whole run, start-up included: informative), match.
# Exit status 1 when a Kineto row does not match. Commit the traces with `cp $OUT/traces/*.json tests/data/traces/pytorch/`.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpulab-pytorch-traces}
mkdir -p "$out/traces" "$out/findings" "$out/native" "$out/logs"
gpulab=${1:-}
if [[ -z $gpulab ]]; then
  OUT=$out/device scripts/device.sh --no-tests >"$out/logs/build.log" 2>&1 || {
    tail -30 "$out/logs/build.log"
    echo "pytorch_traces.sh: building gpulab with scripts/device.sh failed"
    exit 1
  }
  gpulab=build-device/src/cli/gpulab
fi
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))' |
  tee "$out/logs/torch.txt" || { echo "pytorch_traces.sh: needs python3 with torch and a CUDA device"; exit 1; }

# PROGRAMS="a b" runs a subset; NATIVE=0 skips the second run of each program under gpulab's own
# tracer (it doubles the time: torch starts in seconds).
programs=(launch_bound pageable_memcpy sync_api sync_memcpy host_starved um_thrashing pcie_saturation healthy)
[[ -n ${PROGRAMS:-} ]] && read -r -a programs <<<"$PROGRAMS"
native=${NATIVE:-1}
for p in "${programs[@]}"; do
  echo "== $p"
  rm -f "$out/traces/$p.json" "$out/findings/$p.json" "$out/native/$p.json"
  python3 "examples/pytorch/$p.py" --trace "$out/traces/$p.json" >"$out/logs/$p.log" 2>&1 ||
    echo "   $p --trace failed (exit $?): $(tail -1 "$out/logs/$p.log")"
  tail -2 "$out/logs/$p.log" | sed 's/^/   /'
  [[ -f $out/traces/$p.json ]] && echo "   trace: $(du -h "$out/traces/$p.json" | cut -f1)"
  if [[ -f $out/traces/$p.json ]]; then
    "$gpulab" diagnose --trace "$out/traces/$p.json" --json "$out/findings/$p.json" >"$out/logs/$p.diagnose.txt" 2>&1 ||
      echo "   diagnose --trace failed: $(tail -1 "$out/logs/$p.diagnose.txt")"
  fi
  ((native)) || continue
  tmp=$(mktemp -d)  # gpulab's own traces of the whole program are large: not kept
  "$gpulab" diagnose --out "$tmp" --json "$out/native/$p.json" -- python3 "examples/pytorch/$p.py" \
    >"$out/logs/$p.native.txt" 2>&1 || echo "   gpulab diagnose -- $p failed: $(tail -1 "$out/logs/$p.native.txt")"
  rm -rf "$tmp"
done

python3 - "$out" "${programs[@]}" <<'PY'
import json, os, sys
out, programs = sys.argv[1], sys.argv[2:]
kineto_blind = {"um_thrashing"}  # only gpulab's own tracer can see unified-memory thrashing

def verdict(path, planted, blind=False):
    if not os.path.exists(path):
        return "(no result)", "no"
    findings = json.load(open(path))["findings"]
    top = f'{findings[0]["rule"]}/{findings[0]["severity"]}' if findings else "(none)"
    if planted == "healthy":
        ok = not any(f["severity"] == "high" for f in findings)
    else:
        ok = bool(findings) and findings[0]["rule"] == planted and findings[0]["severity"] != "low"
    return top, ("n/a" if blind else ("yes" if ok else "no"))

rows, bad = [], 0
for p in programs:
    planted = "(nothing high)" if p == "healthy" else p
    kt, km = verdict(f"{out}/findings/{p}.json", p, p in kineto_blind)
    nt, nm = verdict(f"{out}/native/{p}.json", p)
    bad += km == "no"
    rows.append((p, planted, kt, km, nt, nm))
head = ("program", "planted rule", "top finding (Kineto trace)", "match", "gpulab tracer, whole run*", "match")
widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
for r in [head] + rows:
    print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
with open(f"{out}/table.json", "w") as f:
    json.dump([dict(zip(head, r)) for r in rows], f, indent=1)
print("n/a: the PyTorch profiler records no unified-memory activity")
print("*: the unprofiled program from start to exit, so start-up (CUDA context, cuBLAS, warm-up) counts too")
sys.exit(1 if bad else 0)
PY
