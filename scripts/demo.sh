#!/usr/bin/env bash
# ./run demo, artifact part: writes an artifact of seeded random tensors through the artifact writer, verifies
# and inspects it, then shows the reader rejecting a copy with one flipped byte. (The runtime demo replaces the
# random tensors with a real model.)   Environment: LOWBIT (the binary), LOWBIT_DEMO_DIR (where to write).
set -euo pipefail
cd "$(dirname "$0")/.."

lowbit=${LOWBIT:-build/release/lowbit}
dir=${LOWBIT_DEMO_DIR:-build/demo}
art="$dir/random.lowbit"
mkdir -p "$dir"

echo "== lowbit demo-artifact: 12 seeded random tensors, payload shards cut at 64 KiB"
"$lowbit" demo-artifact "$art" --tensors 12 --seed 1 --shard-bytes 65536 --force
echo "== lowbit verify"
"$lowbit" verify "$art"
echo "== lowbit inspect"
"$lowbit" inspect "$art"

echo "== a copy with one flipped byte is rejected (exit 3)"
rm -rf "$dir/corrupt.lowbit"
cp -r "$art" "$dir/corrupt.lowbit"
payload=$(ls "$dir"/corrupt.lowbit/*.safetensors | head -n 1)
printf '\x55' | dd of="$payload" bs=1 seek=200 conv=notrunc status=none
status=0
"$lowbit" verify "$dir/corrupt.lowbit" || status=$?
echo "exit status $status"
[ "$status" -eq 3 ]

echo
LOWBIT="$lowbit" scripts/demo_model.sh
