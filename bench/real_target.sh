#!/usr/bin/env bash
# A real pretrained target from its model folder to a measured drafter, as a user runs it:
#   prompts -> blockdraft regenerate (on-policy answers) -> blockdraft data -> blockdraft train
#   -> blockdraft export -> blockdraft eval (batch 1 with DDTree budgets, batch 8) -> z-lab parity.
# usage: bench/real_target.sh TARGET_DIR OUT_DIR [stage ...]   stages: prompts regen data train eval parity (default all)
# Sizes come from the environment (defaults: the one-H200 run of docs/real-targets.md):
#   CONFIG=configs/smollm2-135m.yaml PER_FUNCTION=2 REGEN_BATCH=512 REGEN_TOKENS=384 REGEN_SHARD=2048
#   REGEN_PROMPT_TOKENS=768 REGEN_CHUNK=64 REGEN_SECONDS=0 (0: no limit)
#   REGEN_CACHE=auto RUN_NAME=run-lLAYERS TRAIN_MINUTES=7 LAYERS=3 EVAL_PROMPTS=24 EVAL_TOKENS=192 BUDGETS=16,32,64 DEVICE=auto EXTRA="key=value ..."
set -euo pipefail
target=$1 out=$2; shift 2
stages=${*:-prompts regen data train eval parity}
here=$(cd "$(dirname "$0")/.." && pwd)
config=${CONFIG:-$here/configs/smollm2-135m.yaml}
layers=${LAYERS:-3}
run=$out/${RUN_NAME:-run-l$layers}
mkdir -p "$out"
for stage in $stages; do
  echo "== $stage $(date -u +%H:%M:%S)" >&2
  case $stage in
    prompts) python3 "$here/scripts/make_stdlib_prompts.py" --out "$out/prompts" --per-function "${PER_FUNCTION:-2}" ;;
    regen)
      # a time limit ends the run cleanly: finished shards stay, a rerun continues
      limit=${REGEN_SECONDS:-0}
      cmd=(blockdraft regenerate --target "$target" --in "$out/prompts/train.jsonl" --out "$out/regenerated"
           --batch-size "${REGEN_BATCH:-512}" --max-new-tokens "${REGEN_TOKENS:-384}" --shard-size "${REGEN_SHARD:-2048}"
           --prompt-tokens "${REGEN_PROMPT_TOKENS:-768}" --chunk-tokens "${REGEN_CHUNK:-64}"
           --device "${DEVICE:-auto}" --cache "${REGEN_CACHE:-auto}")
      if [[ $limit != 0 ]]; then timeout -s TERM "$limit" "${cmd[@]}" || [[ $? == 124 || $? == 130 ]]; else "${cmd[@]}"; fi ;;
    data) blockdraft data --target "$target" --config "$config" "$out/regenerated" --json > "$out/data.json" ;;
    train) blockdraft train "$config" "target.path=$target" "data.train_files=[$out/regenerated]" \
             "data.cache_dir=$out/cache" "train.out_dir=$run" "drafter.num_layers=$layers" \
             "train.max_minutes=${TRAIN_MINUTES:-7}" "train.device=${DEVICE:-auto}" \
             "eval.prompts=[$out/prompts/heldout.jsonl]" ${EXTRA:-} ;;
    eval)
      blockdraft export "$run" --out "$run/export"
      common=(--target "$target" --drafter "$run/export" --prompts "$out/prompts/heldout.jsonl"
              --max-new-tokens "${EVAL_TOKENS:-192}" --device "${DEVICE:-auto}" --json)
      blockdraft eval "${common[@]}" --limit "${EVAL_PROMPTS:-24}" --dtype bfloat16 \
        --tree-budget "${BUDGETS:-16,32,64}" > "$run/eval-b1.json"
      blockdraft eval "${common[@]}" --limit 32 --dtype bfloat16 --batch-size 8 > "$run/eval-b8.json" ;;
    parity)
      python3 "$here/bench/zlab_parity.py" --target "$target" --drafter "$run/export" \
        --prompts "$out/prompts/heldout.jsonl" --limit 8 --max-new-tokens 128 --dtype float32 \
        --device "${DEVICE:-cuda}" > "$run/parity.json" || echo "parity: dflash not installed" >&2 ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
