#!/usr/bin/env bash
# How much of each parser the fuzz corpora reach: line, branch and region coverage per source file.
#   scripts/fuzz_coverage.sh [CORPUS_DIR ...]
# Builds the fuzz targets with clang's source-based coverage (no sanitizers) in
# build-fuzz-coverage/, replays each target's seed corpus (tests/fuzz/corpus/<target>/) and, for
# every CORPUS_DIR given, its <target>/ subfolder (build-fuzz/fuzz-corpus holds what
# scripts/fuzz.sh's rounds found), then prints llvm-cov's report over the parsers' sources, all
# targets' runs merged, and writes the per-line HTML under build-fuzz-coverage/html/. A parser
# line that no input reaches is a branch the fuzzers cannot judge: a seed that reaches it is the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPULAB_FUZZ_COVERAGE_BUILD:-build-fuzz-coverage}
cxx=$(command -v clang++ || true)
version=$("$cxx" --version 2>/dev/null | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
profdata=$(command -v "llvm-profdata-$version" || command -v llvm-profdata || true)
cov=$(command -v "llvm-cov-$version" || command -v llvm-cov || true)
if [[ -z $cxx || -z $profdata || -z $cov ]]; then
  echo "fuzz_coverage.sh: clang++, llvm-profdata and llvm-cov are needed (apt-get install clang llvm)" >&2
  exit 1
fi
# The files each target is there to judge (its parser), in the order of tests/fuzz/.
declare -A parsers=(
  [checkpoint_index]=src/core/safetensors.cpp
  [chrome_trace]="src/trace/chrome_trace.cpp src/trace/rules.cpp src/trace/report.cpp src/trace/window.cpp"
  [config]=src/llm/config.cpp
  [http_request]=src/core/http_server.cpp
  [image_folder]=src/data/folder.cpp
  [jpeg]=src/data/jpeg.cpp
  [openai_body]=src/llm/openai_server.cpp
  [safetensors]=src/core/safetensors.cpp
  [tokenizer_encode]="src/llm/tokenizer.cpp src/llm/tokenizer_text.cpp src/llm/nfc.cpp"
  [tokenizer_load]=src/llm/tokenizer.cpp
  [train_checkpoint]=src/train/checkpoint.cpp
)
targets=()
for f in tests/fuzz/fuzz_*.cpp; do
  t=$(basename "$f" .cpp)
  t=${t#fuzz_}
  [[ -n ${parsers[$t]:-} ]] || { echo "fuzz_coverage.sh: no parser files listed for fuzz_$t" >&2; exit 1; }
  targets+=("$t")
done
if [[ ! -f $build/build.ninja ]]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
    -DGPULAB_CUDA_ARCHS=90-virtual -DGPULAB_FUZZ=ON -DGPULAB_SOURCE_COVERAGE=ON >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target "${targets[@]/#/fuzz_}"

profiles=$build/profiles
rm -rf "$profiles" && mkdir -p "$profiles"
objects=() files=()
for t in "${targets[@]}"; do
  corpora=("tests/fuzz/corpus/$t")
  for d in "$@"; do [[ -d $d/$t ]] && corpora+=("$d/$t"); done
  # -runs=0: every input once, nothing new generated; one profile per target.
  LLVM_PROFILE_FILE="$profiles/$t.profraw" "$build/tests/fuzz/fuzz_$t" -runs=0 "${corpora[@]}" \
    >"$profiles/$t.log" 2>&1 || { echo "fuzz_coverage.sh: fuzz_$t failed on its corpus:" >&2; tail -20 "$profiles/$t.log" >&2; exit 1; }
  printf '%-18s %6d inputs\n' "$t" "$(find "${corpora[@]}" -type f | wc -l)"
  objects+=(-object "$build/tests/fuzz/fuzz_$t")
  files+=(${parsers[$t]})
done
"$profdata" merge -sparse "$profiles"/*.profraw -o "$profiles/all.profdata"
mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u)
"$cov" report -instr-profile "$profiles/all.profdata" "${objects[@]:1}" "${files[@]}" | sed "s|$PWD/||"
"$cov" show -format=html -output-dir "$build/html" -instr-profile "$profiles/all.profdata" "${objects[@]:1}" \
  "${files[@]}" >/dev/null
echo "fuzz_coverage.sh: per-line HTML in $build/html/index.html"
