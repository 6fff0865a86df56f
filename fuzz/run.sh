#!/usr/bin/env bash
# Long fuzz runs, bench-style (not CI): each target in turn, one in-process
# libFuzzer (no -jobs: workers would log elsewhere and share two cores), niced,
# for SECONDS (default 600) or 10 million executions, whichever comes first.
# Prints per target: executions, exec/s, seconds, corpus size, findings.
# OOM (-rss_limit_mb, and the malloc limit that follows it) and timeouts
# (-timeout) are findings like panics; libFuzzer stops a target at its first one
# and leaves the input in fuzz/artifacts/<target>/.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Needs the nightly toolchain and cargo-fuzz (`cargo +stable install cargo-fuzz --locked`).
# Built without a sanitizer (all of it is safe Rust; ASan would only halve the
# rate) but with debug assertions, so arithmetic overflow panics.
set -euo pipefail
cd "$(dirname "$0")"
SECONDS_PER_TARGET=${1:-600}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(cpulist quantity manifest topology_json api_request sysfs)
RUNS=${FUZZ_RUNS:-10000000}
RSS_MB=${FUZZ_RSS_MB:-1024}
TIMEOUT_S=${FUZZ_TIMEOUT_S:-5}

python3 seeds.py
# FUZZ_BIN: a folder of already built targets (skips the build).
BIN=${FUZZ_BIN:-target/x86_64-unknown-linux-gnu/release}
if [ -z "${FUZZ_BIN:-}" ]; then
    for t in "${TARGETS[@]}"; do
        # Targets over `specs` alone skip the heavy optional crates.
        case "$t" in
            sysfs|api_request) features=() ;;
            *) features=(--no-default-features) ;;
        esac
        CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} nice -n 19 cargo +nightly fuzz build -s none -a "${features[@]}" "$t" >/dev/null
    done
fi
mkdir -p runs
printf '%-14s %12s %10s %8s %8s %s\n' target executions exec/s seconds corpus findings
for t in "${TARGETS[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    before=$(ls "artifacts/$t" | wc -l)
    log="runs/$t.log"
    # Manifests and requests are bigger than libFuzzer's 4 KiB default.
    max_len=4096
    case $t in manifest | api_request | topology_json) max_len=65536 ;; esac
    start=$(date +%s)
    set +e
    nice -n 19 "$BIN/$t" "corpus/$t" "seeds/$t" -runs="$RUNS" -max_total_time="$SECONDS_PER_TARGET" \
        -rss_limit_mb="$RSS_MB" -timeout="$TIMEOUT_S" -max_len="$max_len" \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1
    rc=$?
    set -e
    secs=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    corpus=$(ls "corpus/$t" | wc -l)
    found=$(($(ls "artifacts/$t" | wc -l) - before))
    what=""
    [ "$rc" -eq 0 ] || what=" (exit $rc: $(grep -m1 -oE 'ERROR: libFuzzer: [a-z-]+|panicked at [^ ]+' "$log" || true); see fuzz/$log)"
    printf '%-14s %12s %10s %8s %8s %s%s\n' "$t" "${execs:-?}" "${rate:-?}" "$secs" "$corpus" "$found" "$what"
done
