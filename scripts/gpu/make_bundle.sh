#!/usr/bin/env bash
# Builds what scripts/gpu/run_plan_tests.sh runs on a GPU machine, into build-gpu/bundle:
#   bin/      hybridcp (runtime commands: bench, run-step, train ...), test_plan_step,
#             test_kernels_cuda, test_sequence_kernels and test_nccl_failure
#   lib/      the shared libraries they need that the GPU machines lack (Abseil, ...);
#   lib/mpi/  Debian's OpenMPI libraries, for a machine without OpenMPI (the GPU machines have
#             their own, which must match their mpirun: the run scripts use those)
#   plans/    the compiled plans (bf16 for the GPU, f32 for the CPU reference)
#   text.bin  real text as bytes (the Debian licence texts), for a training run
# Needs the compiler build (build/bin/hybridcp, from scripts/test.sh or the default preset) to
# compile the plans. The runtime is built without MLIR (preset-like flags below), CUDA on.
#
#   scripts/gpu/make_bundle.sh
# The bundle (~70 MB) is more than a run carries (64 MiB with the working tree): it also goes
# into build-gpu/carry/bundle.tar.gz (~25 MB), which scripts/gpu/common.sh unpacks on the GPU
# machine. Then: run(command="scripts/gpu/run_plan_tests.sh", carry=["build-gpu/carry"]).
# (run_cp_tests.sh on nvidia-h200-x2, run_cp4_tests.sh on nvidia-h200-x4: the same carry.)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=$ROOT/build-gpu
BUNDLE=$BUILD/bundle
HCP=$ROOT/build/bin/hybridcp
JOBS=${JOBS:-2}

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYBRIDCP_BUILD_COMPILER=OFF \
  -DHYBRIDCP_BUILD_TESTS=ON -DHYBRIDCP_ENABLE_CUDA=ON >/dev/null
ninja -C "$BUILD" -j"$JOBS" hybridcp test_plan_step test_kernels_cuda test_sequence_kernels \
  test_nccl_failure

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib/mpi" "$BUNDLE/plans"
cp "$BUILD/bin/hybridcp" "$BUILD/bin/test_plan_step" "$BUILD/bin/test_kernels_cuda" \
  "$BUILD/bin/test_sequence_kernels" "$BUILD/bin/test_nccl_failure" "$BUNDLE/bin/"
strip "$BUNDLE"/bin/*
# Every shared library outside glibc, libstdc++ and the CUDA toolkit (which the GPU machines
# have in newer versions). Debian's OpenMPI libraries travel as one consistent set: the bench
# and the test run one process without mpirun, they only need to load.
for bin in "$BUNDLE"/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u |
  grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcudart|libcublasLt|libcublas|libnccl)\.so' |
  while read -r lib; do
    case $(basename "$lib") in
      libmpi* | libopen-* | libevent* | libhwloc* | libpmix* | libudev*) cp -L "$lib" "$BUNDLE/lib/mpi/" ;;
      *) cp -L "$lib" "$BUNDLE/lib/" ;;
    esac
  done

config=$ROOT/tests/configs/granite-gpu-small.json
for shape in "512 2" "300 1"; do
  read -r seq batch <<<"$shape"
  for dtype in bf16 f32; do
    "$HCP" compile "$config" --seq "$seq" --micro-batch "$batch" --dtype "$dtype" \
      -o "$BUNDLE/plans/small-$seq-$dtype.plan"
  done
done
# Context parallelism on 2 GPUs (scripts/gpu/run_cp_tests.sh) and on 4 (run_cp4_tests.sh):
# zigzag with the all-gather state scan, contiguous with the chain, and zigzag with the experts
# split over the same GPUs (--ep = --cp); checked against the one-rank f32 plan above.
for cp in 2 4; do
  "$HCP" compile "$config" --seq 512 --micro-batch 2 --dtype bf16 --cp $cp --layout zigzag \
    --state-scan allgather -o "$BUNDLE/plans/small-512-bf16-cp$cp-zigzag.plan"
  "$HCP" compile "$config" --seq 512 --micro-batch 2 --dtype bf16 --cp $cp --layout contiguous \
    --state-scan chain -o "$BUNDLE/plans/small-512-bf16-cp$cp-chain.plan"
  "$HCP" compile "$config" --seq 512 --micro-batch 2 --dtype bf16 --cp $cp --ep $cp \
    --layout zigzag -o "$BUNDLE/plans/small-512-bf16-cp$cp-ep$cp.plan"
done
# The other way to give a split scan its incoming state (--incoming-state rescan: the state-only
# summary, then the scan from the state), against the default correction.
"$HCP" compile "$config" --seq 512 --micro-batch 2 --dtype bf16 --cp 2 --layout zigzag \
  --incoming-state rescan -o "$BUNDLE/plans/small-512-bf16-cp2-rescan.plan"
# Data parallelism on 2 GPUs, one sequence each, without and with the experts split over them.
"$HCP" compile "$config" --seq 512 --micro-batch 1 --dtype bf16 --dp 2 \
  -o "$BUNDLE/plans/small-512x1-bf16-dp2.plan"
"$HCP" compile "$config" --seq 512 --micro-batch 1 --dtype bf16 --dp 2 --ep 2 \
  -o "$BUNDLE/plans/small-512x1-bf16-dp2-ep2.plan"
# Gradient accumulation (train --grad-accum 2): one sequence per micro-batch, on 1 GPU and 2.
"$HCP" compile "$config" --seq 512 --micro-batch 1 --dtype bf16 -o "$BUNDLE/plans/small-512x1-bf16.plan"
"$HCP" compile "$config" --seq 512 --micro-batch 1 --dtype bf16 --cp 2 --layout zigzag \
  -o "$BUNDLE/plans/small-512x1-bf16-cp2-zigzag.plan"
# The transformers fixture with the CUDA kernels' shapes (made on the GPU machine, see
# tests/fixtures/make_fixtures.py): its plans, on one GPU and on two.
gpu_config=$ROOT/tests/configs/gpu-shapes.json
for dtype in bf16 f32; do
  "$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype $dtype \
    -o "$BUNDLE/plans/gpu-shapes-$dtype.plan"
done
"$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype bf16 --cp 2 --layout zigzag \
  --state-scan allgather -o "$BUNDLE/plans/gpu-shapes-bf16-cp2-zigzag.plan"
"$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype bf16 --cp 2 --layout contiguous \
  --state-scan chain -o "$BUNDLE/plans/gpu-shapes-bf16-cp2-chain.plan"
"$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype bf16 --cp 2 --ep 2 --layout zigzag \
  -o "$BUNDLE/plans/gpu-shapes-bf16-cp2-ep2.plan"
# The MoE load-balancing loss (compile --router-aux-loss) on the same shapes, and on 2 GPUs.
for dtype in bf16 f32; do
  "$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype $dtype --router-aux-loss 0.5 \
    -o "$BUNDLE/plans/gpu-shapes-aux-$dtype.plan"
done
"$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype bf16 --cp 2 --layout zigzag \
  --router-aux-loss 0.5 -o "$BUNDLE/plans/gpu-shapes-aux-bf16-cp2-zigzag.plan"
# Packed documents (compile --documents; scripts/gpu/run_document_checks.sh): the small model and
# the fixture's shapes (two rows, as tests/fixtures/gpu-shapes-packed), bf16 against f32, on one
# GPU; tiny at s = 8192 and 65536 for the cost.
for dtype in bf16 f32; do
  "$HCP" compile "$config" --seq 512 --micro-batch 2 --dtype $dtype --documents \
    -o "$BUNDLE/plans/small-512-docs-$dtype.plan"
  "$HCP" compile "$gpu_config" --seq 300 --micro-batch 2 --dtype $dtype --documents \
    -o "$BUNDLE/plans/gpu-shapes-docs-$dtype.plan"
done
"$HCP" compile "$config" --seq 512 --micro-batch 2 --dtype bf16 --documents --cp 2 \
  --layout zigzag -o "$BUNDLE/plans/small-512-docs-bf16-cp2-zigzag.plan"
for seq in 8192 65536; do
  "$HCP" compile --model granite-4.0-h-tiny --seq $seq --micro-batch 1 --dtype bf16 --documents \
    --recompute -o "$BUNDLE/plans/tiny-$seq-bf16-docs-recompute.plan"
done
"$HCP" compile --model granite-4.0-h-tiny --seq 8192 --micro-batch 1 --dtype bf16 --documents \
  -o "$BUNDLE/plans/tiny-8192-bf16-docs.plan"
# On 4 GPUs: contiguous only (300 tokens do not split into zigzag's 8 pieces), and with ep=4.
"$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype bf16 --cp 4 --layout contiguous \
  --state-scan chain -o "$BUNDLE/plans/gpu-shapes-bf16-cp4-chain.plan"
"$HCP" compile "$gpu_config" --seq 300 --micro-batch 1 --dtype bf16 --cp 4 --ep 4 \
  --layout contiguous -o "$BUNDLE/plans/gpu-shapes-bf16-cp4-ep4.plan"
# Long context on 2 GPUs: s = 131072 split in two, with activation recomputation.
"$HCP" compile --model granite-4.0-h-tiny --seq 131072 --micro-batch 1 --dtype bf16 --cp 2 \
  --layout zigzag --recompute -o "$BUNDLE/plans/tiny-131072-bf16-cp2-recompute.plan"
# Data parallelism on 2 GPUs: each its own sequence of 8192, gradients summed over both.
"$HCP" compile --model granite-4.0-h-tiny --seq 8192 --micro-batch 1 --dtype bf16 --dp 2 \
  -o "$BUNDLE/plans/tiny-8192-bf16-dp2.plan"
"$HCP" compile --model granite-4.0-h-tiny --seq 16384 --micro-batch 1 --dtype bf16 --cp 2 \
  --layout zigzag -o "$BUNDLE/plans/tiny-16384-bf16-cp2.plan"
"$HCP" compile --model granite-4.0-h-tiny --seq 16384 --micro-batch 1 --dtype bf16 --cp 2 \
  --layout zigzag --incoming-state rescan -o "$BUNDLE/plans/tiny-16384-bf16-cp2-rescan.plan"
"$HCP" compile --model granite-4.0-h-tiny --seq 16384 --micro-batch 1 --dtype bf16 --cp 2 --ep 2 \
  --layout zigzag -o "$BUNDLE/plans/tiny-16384-bf16-cp2-ep2.plan"
"$HCP" compile --model granite-4.0-h-tiny --seq 8192 --micro-batch 1 --dtype bf16 \
  -o "$BUNDLE/plans/tiny-8192-bf16.plan"
# Dense models the step's CUDA graph serves (no MoE step reads ids on the host): the issue's
# 350m and micro targets.
for model in 350m micro; do
  "$HCP" compile --model granite-4.0-h-$model --seq 8192 --micro-batch 1 --dtype bf16 \
    -o "$BUNDLE/plans/$model-8192-bf16.plan"
done
# The same with the MoE load-balancing loss (its cost: scripts/gpu/run_data_checks.sh).
"$HCP" compile --model granite-4.0-h-tiny --seq 8192 --micro-batch 1 --dtype bf16 \
  --router-aux-loss 0.001 -o "$BUNDLE/plans/tiny-8192-bf16-aux.plan"
# The same with the MoE backward recomputing the experts' first product (hcp-keep-expert-h off).
"$HCP" compile --model granite-4.0-h-tiny --seq 8192 --micro-batch 1 --dtype bf16 \
  --recompute-expert-h -o "$BUNDLE/plans/tiny-8192-bf16-recompute-expert-h.plan"
# With activation recomputation: the same step, and sequences 8 and 16 times longer on one GPU.
# cp=4 over 4 GPUs at s = 32768: 8192 tokens per GPU, as one GPU at s = 8192.
"$HCP" compile --model granite-4.0-h-tiny --seq 32768 --micro-batch 1 --dtype bf16 --cp 4 \
  --layout zigzag -o "$BUNDLE/plans/tiny-32768-bf16-cp4.plan"
for seq in 8192 65536 131072; do
  "$HCP" compile --model granite-4.0-h-tiny --seq $seq --micro-batch 1 --dtype bf16 --recompute \
    -o "$BUNDLE/plans/tiny-$seq-bf16-recompute.plan"
  # Attention recomputed as well (what --recompute did before it kept attention's output).
  "$HCP" compile --model granite-4.0-h-tiny --seq $seq --micro-batch 1 --dtype bf16 --recompute \
    --recompute-attention -o "$BUNDLE/plans/tiny-$seq-bf16-recompute-attn.plan"
done
# The small demo model in f32 (CPU ranks): scripts/gpu/check_from_pretrained.sh.
"$HCP" compile "$ROOT/tests/configs/granite-small-demo.json" --seq 64 --micro-batch 2 \
  -o "$BUNDLE/plans/demo-64-f32.plan"
"$HCP" tokenize /usr/share/common-licenses -o "$BUNDLE/text.bin"
# Real data on the GPU (scripts/gpu/run_data_checks.sh): the small GPU model with the vocabulary
# of the committed Granite-style tokenizer, chat data with its loss mask and a held-out set, the
# same chats with their masked window-end targets changed, and the licence texts as a second
# source for a blend.
data=$BUNDLE/data
tokenizer=$ROOT/tests/fixtures/tokenizer/granite-style.json
mkdir -p "$data"
python3 - "$config" "$data/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(vocab_size=1536, bos_token_id=0, eos_token_id=0, pad_token_id=0)  # <|end_of_text|>
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
for dtype in bf16 f32; do
  "$HCP" compile "$data/config.json" --seq 512 --micro-batch 2 --dtype $dtype \
    -o "$BUNDLE/plans/data-512-$dtype.plan"
done
python3 - "$data" <<'PY'
import json, random, sys
random.seed(1)
def chat():
    a, b = random.randrange(1000), random.randrange(1000)
    question = f"Please add {a} and {b}, then tell me the sum in words and in digits, briefly."
    return {"messages": [{"role": "system", "content": "You are a careful calculator."},
                         {"role": "user", "content": question},
                         {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}
for name, count in (("chat", 600), ("chat-eval", 60)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(count):
            f.write(json.dumps(chat()) + "\n")
PY
for name in chat chat-eval; do
  "$HCP" tokenize --tokenizer "$tokenizer" "$data/$name.jsonl" -o "$data/$name"
  rm "$data/$name.jsonl"
done
python3 "$ROOT/tests/lit/tools/Inputs/loss_mask.py" retarget "$data/chat" "$data/chat-retargeted" \
  512 1500
"$HCP" tokenize --tokenizer "$tokenizer" /usr/share/common-licenses -o "$data/licences"
cp "$tokenizer" "$data/tokenizer.json"
mkdir -p "$BUILD/carry"
tar -C "$BUILD" -czf "$BUILD/carry/bundle.tar.gz" bundle
du -sh "$BUNDLE" "$BUILD/carry/bundle.tar.gz"
