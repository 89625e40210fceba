#!/usr/bin/env bash
# NeMo Gym's own tools on a file that `gym-bridge collect` wrote, with nothing else beside it:
#   1. gym-bridge collect (the embedded tiny policy, the math server) -> rollouts.jsonl + NeMo Gym's side files
#   2. NeMo Gym's `gym eval profile` on them
#   3. NeMo Gym's `gym eval reverify` on them against our math server, started by NeMo Gym from a config
#
# NeMo Gym is installed into its own venv by scripts/nemo_gym_venv.sh (never the project's venv).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=/work/main/.venv/bin/python
PORT=${PORT:-18731}
. scripts/nemo_gym_venv.sh

WORK=$(mktemp -d)
echo "work dir: $WORK"
head -20 recipes/data/arith_val.jsonl > "$WORK/tasks.jsonl"

echo "== 1. gym-bridge collect"
PYTHONPATH=$REPO "$PY" -m gym_bridge.cli collect "$WORK/tasks.jsonl" -o "$WORK/rollouts.jsonl" --env math \
    --policy tiny --num-repeats 4 --temperature 1.0 --concurrency 8 --seed 0 --no-progress
ls "$WORK"

echo "== 2. gym eval profile"
(cd "$WORK" && "$NG_VENV/bin/gym" eval profile --inputs rollouts_materialized_inputs.jsonl --rollouts rollouts.jsonl \
    2>&1 | grep -v -i "warn\|_confidence_interval")

echo "== 3. gym eval reverify (NeMo Gym starts our math server from its config)"
# A NeMo Gym server directory for our math server: its venv is ours, its entrypoint runs `gym-bridge serve math`
# on the host and port NeMo Gym gives it, and leaves its pid behind (NeMo Gym 0.7.0 can orphan it).
SERVER_DIR=$WORK/resources_servers/gb_math
mkdir -p "$SERVER_DIR"
touch "$SERVER_DIR/requirements.txt"
ln -s "$(dirname "$(dirname "$PY")")" "$SERVER_DIR/.venv"
cat > "$SERVER_DIR/app.py" <<'EOF'
import os
import sys

import yaml

config = yaml.safe_load(os.environ["NEMO_GYM_CONFIG_DICT"])
entry = config[os.environ["NEMO_GYM_CONFIG_PATH"]]["resources_servers"]["gb_math"]
with open("server.pid", "w") as f:
    f.write(str(os.getpid()))
command = ["-m", "gym_bridge.cli", "serve", "math", "--host", str(entry["host"]), "--port", str(entry["port"])]
os.execv(sys.executable, [sys.executable, *command])
EOF
cat > "$WORK/gb_math.yaml" <<EOF
gb_math:
  resources_servers:
    gb_math:
      entrypoint: app.py
      host: 127.0.0.1
      port: $PORT
      domain: math
EOF
cleanup() { [ -f "$SERVER_DIR/server.pid" ] && kill "$(cat "$SERVER_DIR/server.pid")" 2>/dev/null || true; }
trap cleanup EXIT
(cd "$WORK" && PYTHONPATH=$REPO "$NG_VENV/bin/gym" eval reverify --config gb_math.yaml +skip_venv_if_present=true \
    --inputs rollouts_materialized_inputs.jsonl --rollouts rollouts.jsonl --output reverified.jsonl \
    > reverify.log 2>&1 < /dev/null) &
wait $!
cleanup
grep -A8 "Key metrics" "$WORK/reverify.log" || tail -30 "$WORK/reverify.log"
"$PY" - "$WORK" <<'EOF'
import json
import sys
from pathlib import Path

work = Path(sys.argv[1])
def rewards(name):
    rows = [json.loads(line) for line in (work / name).read_text().splitlines()]
    return {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in rows}
ours, theirs = rewards("rollouts.jsonl"), rewards("reverified.jsonl")
changed = sum(ours[k] != theirs.get(k) for k in ours)
print(f"reverify: {len(theirs)}/{len(ours)} rollouts re-verified by NeMo Gym, {changed} rewards changed")
ours_agg = json.loads((work / "rollouts_aggregate_metrics.json").read_text())[0]["key_metrics"]
theirs_agg = json.loads((work / "reverified_aggregate_metrics.json").read_text())[0]["key_metrics"]
print(f"key metrics, collect: {ours_agg}")
print(f"key metrics, NeMo Gym's reverify: {theirs_agg}")
sys.exit(0 if len(theirs) == len(ours) and changed == 0 else 1)
EOF
