#!/usr/bin/env bash
# The whole parity matrix (scenarios/parity) on the NCCL backend, one process with one rank per
# visible GPU, against the CPU reference; each rank computes on its GPU (--compute cuda, the nccl
# default). Configurations needing more ranks than GPUs are reported "not run" and not counted
# as failures here. Skipped (exit 77, ctest SKIP_RETURN_CODE) with fewer than two GPUs: one GPU is
# covered by the other gpu_tests.
# Usage: nccl_matrix.sh SHARDCHECK SOURCE_DIR OUT_DIR
set -uo pipefail
shardcheck=$1 root=$2 out=$3
gpus=0
if command -v nvidia-smi >/dev/null; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
if [ "${gpus:-0}" -lt 2 ]; then
  echo "SKIP: the NCCL parity matrix needs two or more GPUs; $gpus visible here"
  exit 77
fi
rm -rf "$out" && mkdir -p "$out"
"$shardcheck" matrix "$root/scenarios/parity" --backend nccl --report "$out"
rc=$?
# Exit 1 also counts configurations that need more ranks than there are GPUs ("not run"); those
# are this machine's limit, not a failure. Every other row must pass, and at least one must run.
[ "$rc" -le 1 ] || exit "$rc"
python3 - "$out" <<'PY'
import json, pathlib, sys
rows = []
report = json.loads((pathlib.Path(sys.argv[1]) / "report.json").read_text())
for scenario in report.get("scenarios", [report]):  # a matrix report holds one per scenario
    rows += scenario["parity"]
ran = [r for r in rows if not r["detail"].startswith("not run: needs")]
bad = [r for r in ran if not r["pass"]]
for r in bad:
    print(f"FAIL {r['config']}: {r['detail']}")
print(f"nccl matrix: {len(ran) - len(bad)} passed, {len(bad)} failed, "
      f"{len(rows) - len(ran)} not run (more ranks than GPUs)")
sys.exit(1 if bad or not ran else 0)
PY
