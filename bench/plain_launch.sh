#!/usr/bin/env bash
# The baseline tfl is measured against: a plain script that sets TF_CONFIG and starts
# the same processes, with the same environment tfl's plan gives them, each writing its
# own log; it waits for all of them and exits non-zero if any failed.
#
#   plain_launch.sh RUN_DIR PYTHON JOB PORTS [JOB ARGS...]
#
# PORTS: comma-separated localhost ports, the chief's first, then one per worker.
set -u
run_dir=$1 python=$2 job=$3
IFS=, read -ra ports <<< "$4"
shift 4

chief="\"127.0.0.1:${ports[0]}\""
workers=""
for port in "${ports[@]:1}"; do workers+="${workers:+,}\"127.0.0.1:$port\""; done
cluster="\"chief\":[$chief]${workers:+,\"worker\":[$workers]}"
mkdir -p "$run_dir/logs" "$run_dir/progress"

pids=()
for i in "${!ports[@]}"; do
  if [ "$i" -eq 0 ]; then type=chief index=0; else type=worker index=$((i - 1)); fi
  TF_CONFIG="{\"cluster\":{$cluster},\"task\":{\"type\":\"$type\",\"index\":$index}}" \
  TF_USE_LEGACY_KERAS=1 PYTHONUNBUFFERED=1 TFL_RUN_ID="${run_dir##*/}" TFL_TASK="$type:$index" \
  TFL_RUN_DIR="$run_dir" TFL_PROGRESS_FILE="$run_dir/progress/$type-$index.json" TFL_ATTEMPT=0 \
    "$python" -u "$job" "$@" > "$run_dir/logs/$type-$index.log" 2>&1 < /dev/null &
  pids+=($!)
done

status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
