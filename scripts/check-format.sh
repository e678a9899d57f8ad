#!/usr/bin/env bash
# Checks that the C++ lines changed since BASE (default: the merge base with main, else the previous commit)
# follow .clang-format. Only changed lines are checked: the tree predates the file and is not reformatted
# wholesale. Prints the diff clang-format wants and exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-}
if [ -z "$base" ]; then
  base=$(git merge-base HEAD main 2>/dev/null || git rev-parse --verify -q HEAD~1 || true)
fi
if [ -z "$base" ] || [ "$(git rev-parse HEAD)" = "$(git rev-parse "$base")" ]; then
  echo "[format] no earlier commit to compare with; nothing to check" >&2
  exit 0
fi
out=$(git clang-format --quiet --diff --extensions cpp,h,cu,cuh "$base" -- src include tests fuzz bench || true)
if [ -n "$out" ] && [ "$out" != "no modified files to format" ]; then
  echo "$out"
  echo "[format] the lines above changed since $base and differ from .clang-format (fix: git clang-format $base)" >&2
  exit 1
fi
echo "[format] lines changed since $base follow .clang-format" >&2
