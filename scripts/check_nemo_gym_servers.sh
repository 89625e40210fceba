#!/usr/bin/env bash
# NeMo Gym's own `gym env start` launches our math, code and tool_use servers from the configs we ship
# (resources_servers/<name>/configs/<name>.yaml), and NeMo Gym's simple_agent collects rollouts against them:
#   0. NeMo Gym 0.7.0 in its own venv (scripts/nemo_gym_venv.sh)
#   1. `gym env validate`: NeMo Gym's config validation of our three configs
#   2. our policy server (gym-bridge serve policy), the model NeMo Gym's openai_model talks to
#   3. `gym env start --search-dir <repo> --resources-server math|code|tool_use --model-type openai_model`
#   4. `gym eval run --no-serve --agent <name>_simple_agent` for each server (rollouts, NeMo Gym's aggregate)
#   5. an already-running `gym-bridge serve math` used through `gym_bridge.already_running: true`
# Server venvs: NeMo Gym installed from its wheel does not install a '../..' requirement, so each server is
# given a venv by +uv_venv_dir (symlinks: ours for our servers, NeMo Gym's for its agent, model and env server)
# and +skip_venv_if_present=true.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PY:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=/work/main/.venv/bin/python
POLICY=${POLICY:-smollm2-135m}  # the tool_use prompts (with tools) are ~2,000 tokens, over tiny's context
POLICY_PORT=${POLICY_PORT:-18740}
MATH_PORT=${MATH_PORT:-18741}
. scripts/nemo_gym_venv.sh
NG_SITE=$("$NG_VENV/bin/python" -c 'import nemo_gym, pathlib; print(pathlib.Path(nemo_gym.__file__).parents[1])')

WORK=$(mktemp -d)
echo "work dir: $WORK"
cd "$WORK"
OUR_VENV=$(dirname "$(dirname "$PY")")
for s in math code tool_use; do mkdir -p venvs/resources_servers/$s && ln -s "$OUR_VENV" venvs/resources_servers/$s/.venv; done
for d in responses_api_agents/simple_agent responses_api_models/openai_model environment_servers/legacy_agent; do
    mkdir -p venvs/$d && ln -s "$NG_VENV" venvs/$d/.venv
done
MODEL=(--model-type openai_model --model-url "http://127.0.0.1:$POLICY_PORT/v1" --model "$POLICY" --model-api-key none)
SERVERS=(--search-dir "$REPO" --resources-server math --resources-server code --resources-server tool_use)
VENVS=("+uv_venv_dir=$WORK/venvs" +skip_venv_if_present=true)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -INT -- "-$p" 2>/dev/null || true; done; sleep 5;
            for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT

echo "== 1. gym env validate"
"$NG_VENV/bin/gym" env validate "${SERVERS[@]}" "${MODEL[@]}" 2>&1 | grep -v -i warn | tail -1

echo "== 2. policy server ($POLICY)"
setsid env PYTHONPATH="$REPO" "$PY" -m gym_bridge.cli serve policy --model "$POLICY" --port "$POLICY_PORT" \
    --max-output-tokens 64 > policy.log 2>&1 < /dev/null &
pids+=($!)
until curl -sf "http://127.0.0.1:$POLICY_PORT/health" > /dev/null; do sleep 2; done

echo "== 3. gym env start"
setsid "$NG_VENV/bin/gym" env start "${SERVERS[@]}" "${MODEL[@]}" "${VENVS[@]}" > env_start.log 2>&1 < /dev/null &
pids+=($!)
until grep -qs "servers ready!" env_start.log; do sleep 3; done
sleep 3
grep "listening on\|Starting \`" env_start.log

echo "== 4. gym eval run (NeMo Gym's simple_agent against our servers)"
head -20 "$REPO/recipes/data/arith_val.jsonl" > arith.jsonl
run() {  # name input limit repeats
    "$NG_VENV/bin/gym" eval run --no-serve --agent "$1_simple_agent" --input "$2" --output "$WORK/$1_rollouts.jsonl" \
        --limit "$3" --num-repeats "$4" --temperature 1.0 > "eval_$1.log" 2>&1
    echo "-- $1: exit $?"
    grep -A12 "^Key metrics" "eval_$1.log" | grep -v "^Finished\|^Fully\|^Rollouts"
}
run math arith.jsonl 8 1
run code "$REPO/resources_servers/code/data/example.jsonl" 3 1
run tool_use "$REPO/resources_servers/tool_use/data/example.jsonl" 2 1
"$PY" - "$WORK" <<'PYEOF'
import json, sys
from pathlib import Path
for name in ("math", "code", "tool_use"):
    rows = [json.loads(line) for line in (Path(sys.argv[1]) / f"{name}_rollouts.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows]
    print(f"{name}: {len(rows)} rollouts by NeMo Gym's simple_agent, mean reward {sum(rewards) / len(rewards):.3f}, "
          f"verify fields: {sorted(k for k in rows[0] if k in ('extracted_answer', 'failure_kind', 'extraction_method'))}")
PYEOF
kill -INT -- "-${pids[1]}"; sleep 20

echo "== 5. an already-running server (gym_bridge.already_running: true)"
setsid env PYTHONPATH="$REPO" "$PY" -m gym_bridge.cli serve math --port "$MATH_PORT" > math_serve.log 2>&1 < /dev/null &
pids+=($!)
until curl -sf "http://127.0.0.1:$MATH_PORT/health" > /dev/null; do sleep 1; done
cat > running_math.yaml <<YAML
math:
  resources_servers:
    math:
      entrypoint: nemo_gym_app.py
      domain: math
      host: 127.0.0.1
      port: $MATH_PORT
      gym_bridge:
        already_running: true
YAML
setsid "$NG_VENV/bin/gym" env start --search-dir "$REPO" --config "$REPO/resources_servers/math/configs/math.yaml" \
    --config running_math.yaml "${MODEL[@]}" "${VENVS[@]}" > env_start_running.log 2>&1 < /dev/null &
pids+=($!)
until grep -qs "servers ready!" env_start_running.log; do sleep 3; done
sleep 3
grep "already at" env_start_running.log
run math arith.jsonl 4 1
echo "requests our already-running math server saw: $(curl -s "http://127.0.0.1:$MATH_PORT/health")"
