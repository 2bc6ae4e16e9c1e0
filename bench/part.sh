# Sourced by the bench/multi_gpu_*.sh scripts. part NAME COMMAND...: runs it, logging to
# $out/NAME.log; on a non-zero exit prints the status and the log's last lines and sets failed=1,
# so the script goes on with its next part and exits 1 at the end.
failed=0
part() {
  local name=$1
  shift
  echo "== $name: $*"
  "$@" > "$out/$name.log" 2>&1
  local status=$?
  if ((status != 0)); then
    echo "   FAILED (exit $status), last lines of $out/$name.log:"
    tail -5 "$out/$name.log" | sed 's/^/   /'
    failed=1
  fi
}
