#!/usr/bin/env bash
# One prepared run of every GPU check, for a session that is lent a GPU machine (the
# project never needs one). Each part has its own time limit, so one slow part cannot eat
# the others' time; everything goes under $OUT (default ./gpu-check), a part's log beside
# its results. About 9 minutes on one H200 (16 cores):
#
#   bash benchmarks/gpu_check.sh                     # stoker is read from src/ (no install needed)
#   OUT=/tmp/g bash benchmarks/gpu_check.sh quick    # ~3 minutes: tests, transfer, fitsync
#   OUT=/tmp/g bash benchmarks/gpu_check.sh decode   # <= 5 minutes: JPEG decode on the GPU (below)
#   TINY=1 OUT=/tmp/g bash benchmarks/gpu_check.sh decode   # the same parts on the CPU, a few images
#   OUT=/tmp/g bash benchmarks/gpu_check.sh readers  # <= 5 minutes: what the training process keeps (below)
#   TINY=1 OUT=/tmp/g bash benchmarks/gpu_check.sh readers  # the same on the CPU, a few images
#
# "readers" trains ResNet-50 bf16 (channels_last, batch 256) from encoded JPEG shards with
# stoker's own pick and with 14 worker processes, each with the reader placement
# (stoker.loading.reader_cpu) and without it (+unplaced), against the synthetic ceiling
# (target: >= 0.9x); then the stand-in step of benchmarks/bench_train_cpu.py on this
# machine's cores. The numbers go to $OUT/readers/{results.json,results.md,cpu.md}.
#
# "decode" measures JPEG shards decoded on the GPU (stoker.decode.device) as the issue's
# table: read alone (CPU decode with 0 / 8 / 14 worker processes and the default threads,
# the device path through the loader and alone), busy CPU seconds per 1,000 images, pixel
# agreement with the CPU path, nvImageCodec by crop box against whole images (interleaved
# rounds), and a ResNet-50 bf16 loop (CPU decode, device path, decoder="auto") against the
# synthetic ceiling; parts decode-tests (the CUDA tests and the crafted-JPEG fuzz arm on the
# device path), decode-read, decode-region, decode-train, decode-table.
# The numbers go to $OUT/issue37/{read.json,results.json,table.md}. For the hardware
# JPEG engine and the region decode bring nvImageCodec's wheels too (about 29 MB; with
# simplejpeg's, under the device tool's 64 MiB carry):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#       nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.3.2.43
# (name nvidia-nvjpeg's version: unpinned, a manylinux_2_28-only download takes its 1-KB
# placeholder 0.0.0a0. For a CUDA 12 build of torch: nvidia-nvimgcodec-cu12 and
# nvidia-nvjpeg-cu12.) Part env says which engine starts on the GPU; without them the
# device path decodes with torchvision.io and says so (read.json's "agreement" engine).
#
# The lent machine has no package registry. Its image has torch, torchvision, pyarrow,
# click, pillow, tqdm, tensorboard, fsspec, pytest, hypothesis and pytest-timeout, but not
# simplejpeg: bring its wheel for Python 3.12 in .whl/ (ignored by git; name .whl in the
# device tool's carry), made here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_17_x86_64 -d .whl simplejpeg==1.9.0
# and this script installs what .whl holds into /tmp/site first.
#
# Parts:
#   env       the GPU, CUDA, torch, cores
#   tests     the suite's CUDA-only tests (nvJPEG decode, the nvjpeg loader)
#   issue13   ResNet-50, AMP bf16, channels_last, batch 256: pixel shards, JPEG shards (CPU
#             decode and nvJPEG) vs synthetic data on the GPU; nvJPEG vs the CPU decode limit
#   fitsync   fit reading the loss back every batch vs every 16 (ResNet-18, batch 128)
#   gather    the pixel gather on this machine's cores (1 vs 2 copying threads)
#   ddp       DDP over NCCL, when there are two GPUs or more
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-check}"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! "$PYTHON" -c "import simplejpeg" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
mkdir -p "$OUT"
: >"$OUT/summary.txt"
quick="${1:-}"

part() {  # part NAME SECONDS COMMAND...: run COMMAND with a limit; its log in $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)" | tee -a "$OUT/summary.txt"
    local start=$SECONDS
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "   rc=$rc in $((SECONDS - start))s" | tee -a "$OUT/summary.txt"
    tail -n 25 "$OUT/$name.log" >>"$OUT/summary.txt"
}

if [ "$quick" = "readers" ]; then
    D="$OUT/readers"
    x=1
    if [ -n "${TINY:-}" ]; then  # on the CPU, a few images: the script runs, nothing is measured
        x=4
        train_args=(--allow-cpu --model small_cnn --batch-size 16 --n 96 --classes 4 --epochs 1
                    --cases synthetic:off jpeg:off jpeg:off+unplaced jpeg:off+proc2 jpeg:off+proc2+unplaced)
        cpu_args=(--quick)
    else
        train_args=(--suite readers --n 8000 --epochs 2)
        cpu_args=(--rounds 2 --seconds 1 --n 3000 --batch-size 256 --launch-ops 2000)
    fi
    part env $((15 * x)) "$PYTHON" -c "
import os, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
print('cores', len(os.sched_getaffinity(0)))
from stoker.loading.reader_cpu import plan_readers; print('placement:', plan_readers().reason)"
    part readers-train $((170 * x)) "$PYTHON" benchmarks/bench_gpu_train.py --out "$D" --no-decode --quiet "${train_args[@]}"
    part readers-cpu $((100 * x)) "$PYTHON" benchmarks/bench_train_cpu.py "${cpu_args[@]}"
    cp "$OUT/readers-cpu.log" "$D/cpu.md" 2>/dev/null
    cat "$D/results.md" "$D/cpu.md" 2>/dev/null
    rm -rf "$D/data" "$D/runs"/*/*.pt 2>/dev/null  # generated data and checkpoints: not worth bringing back
    echo "done: $OUT/summary.txt"
    exit 0
fi

if [ "$quick" = "decode" ]; then
    D="$OUT/issue37"
    x=1  # limits x4 for TINY: a small shared CPU machine imports torch in seconds, not tenths
    if [ -n "${TINY:-}" ]; then  # on the CPU, a few images: the script runs, nothing is measured
        x=4
        read_args=(--tiny --n 96 --batch-size 16 --workers 0,2 --seconds 1)
        region_args=(--tiny --n 96 --batch-size 16 --region 2 --seconds 0.5)
        train_args=(--allow-cpu --model small_cnn --batch-size 16 --n 96 --classes 4 --epochs 1 --workers 2
                    --cases synthetic:off jpeg:off nvjpeg:off autojpeg:off)
    else
        read_args=(--n 8000 --batch-size 256 --workers 0,8,14 --seconds 3)
        region_args=(--n 8000 --batch-size 256 --region 3 --seconds 2)
        train_args=(--suite issue37 --n 8000 --epochs 2)
    fi
    part env $((10 * x)) "$PYTHON" -c "
import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
from stoker.decode.device import DeviceDecoder, nvimagecodec_available; print('nvimagecodec', nvimagecodec_available())
print('engine on', 'cuda' if torch.cuda.is_available() else 'cpu', DeviceDecoder('cuda' if torch.cuda.is_available() else 'cpu', 'nvimagecodec').engine)"
    part decode-tests $((70 * x)) "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_decode_device.py \
        tests/shards/test_fast_paths.py tests/test_jpeg.py tests/reliability/test_decode_crafted_jpeg.py \
        -k "device or auto or nvjpeg or crafted_jpegs_through_the_batched or huge_header"
    part decode-read $((90 * x)) "$PYTHON" benchmarks/bench_gpu_decode.py --out "$D" "${read_args[@]}"
    if [ "$("$PYTHON" -c 'import importlib.util as u; print(u.find_spec("nvidia") is not None and u.find_spec("nvidia.nvimgcodec") is not None)' 2>/dev/null)" = True ]; then
        part decode-region $((25 * x)) "$PYTHON" benchmarks/bench_gpu_decode.py --out "$D" "${region_args[@]}"
    else
        echo "== decode-region: skipped (nvImageCodec is not installed: see .whl above)" | tee -a "$OUT/summary.txt"
    fi
    part decode-train $((95 * x)) "$PYTHON" benchmarks/bench_gpu_train.py --out "$D" --no-decode --quiet "${train_args[@]}"
    part decode-table $((10 * x)) "$PYTHON" benchmarks/bench_gpu_decode.py --out "$D" --table
    cat "$D/table.md" 2>/dev/null
    rm -rf "$D/data" "$D/runs"/*/*.pt 2>/dev/null  # generated data and checkpoints: not worth bringing back
    echo "done: $OUT/summary.txt"
    exit 0
fi

part env 60 "$PYTHON" -c "
import os, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
print('devices', [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
print('cores', len(os.sched_getaffinity(0)))"
part tests 180 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_jpeg.py tests/shards/test_fast_paths.py -k "cuda or nvjpeg or gpu"
part fitsync 240 "$PYTHON" benchmarks/bench_gpu_train.py --suite fitsync --out "$OUT/fitsync" --n 6000 --epochs 2 --quiet
if [ "$quick" != "quick" ]; then
    part issue13 330 "$PYTHON" benchmarks/bench_gpu_train.py --suite issue13 --out "$OUT/issue13" --n 8000 --epochs 2 --quiet
    part gather 150 "$PYTHON" benchmarks/bench_decode.py --only gather --n 6000 --seconds 2 --rounds 2 --out "$OUT/decode-data"
    gpus=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    if [ "${gpus:-0}" -ge 2 ]; then
        part ddp 240 "$PYTHON" benchmarks/bench_ddp_gpu.py --nproc 2 --n 6000 --epochs 2 --timeout-s 220 --out "$OUT/ddp"
    else
        echo "== ddp: skipped ($gpus GPU; DDP over NCCL needs two)" | tee -a "$OUT/summary.txt"
    fi
fi
rm -rf "$OUT/decode-data" "$OUT"/*/data 2>/dev/null  # generated data: not worth bringing back
echo "done: $OUT/summary.txt"
