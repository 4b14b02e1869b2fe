#!/usr/bin/env bash
# Runs a libFuzzer target for a bounded time from its seed corpus (read only: what the fuzzer
# finds goes to a scratch directory). A crash fails the test; its input is kept beside the
# build (fuzz-artifacts/) and printed, to be fixed and added to the corpus.
#   tests/fuzz/run.sh FUZZER SEED_DIR SECONDS
set -uo pipefail
fuzzer=$1 seeds=$2 seconds=$3
if [[ ! -x $fuzzer ]]; then
  echo "SKIPPED: $fuzzer was not built (it needs clang with libFuzzer: apt-get install clang)"
  exit 77
fi
work=$(mktemp -d /tmp/pslab-fuzz-XXXXXX)
artifacts=$(dirname "$fuzzer")/fuzz-artifacts
mkdir -p "$artifacts"
trap 'rm -rf "$work"' EXIT
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "$work" "$seeds"
rc=$?
if ((rc != 0)); then
  echo "fuzz: $fuzzer failed (exit $rc); the input that did it is in $artifacts/:" >&2
  ls -l "$artifacts" >&2
fi
exit $rc
