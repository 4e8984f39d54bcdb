#!/usr/bin/env bash
# Peak resident memory and wall time of the file commands, two builds alternating:
#   scripts/peak_memory.sh OLD_BINARY NEW_BINARY FILE.safetensors [THREADS] [ROUNDS] [DIR]
# For each round and build: `compress`, `decompress` (the restored file compared with FILE) and
# `verify --against FILE`, each under `/usr/bin/time -f "%e s %M KiB"` (%M: the peak resident set,
# the mapped input included as far as it is resident). THREADS defaults to 0 (every core), ROUNDS
# to 3; the archive and the restored file go to DIR (default /tmp/tz-peak) and are removed at the
# end. Exit status non-zero if a command fails or a restored file differs.
set -uo pipefail
old=$1 new=$2 file=$3 threads=${4:-0} rounds=${5:-3} dir=${6:-/tmp/tz-peak}
mkdir -p "$dir"
rc=0
# Prints the time and peak; returns non-zero if the command failed (it runs in the `$(...)`
# subshell of its caller, so the caller records the failure: `x=$(measure ...) || rc=1`).
measure() {
    local status=0
    /usr/bin/time -o "$dir/time.txt" -f "%e s %M KiB" "$@" 2>/dev/null || status=1
    [[ $status == 0 ]] || echo "FAILED: $*" >&2
    tail -1 "$dir/time.txt"
    return $status
}
for r in $(seq "$rounds"); do
    for v in old new; do
        b=$old
        [[ $v == new ]] && b=$new
        # No file of the previous build's step may stand in for a failed one.
        rm -f "$dir/a.tz" "$dir/restored"
        c=$(measure "$b" compress --threads "$threads" -f "$file" -o "$dir/a.tz") || rc=1
        d=$(measure "$b" decompress --threads "$threads" -f "$dir/a.tz" -o "$dir/restored") || rc=1
        if ! cmp -s "$file" "$dir/restored"; then
            echo "round $r $v: the restored file differs" >&2
            rc=1
        fi
        v2=$(measure "$b" verify --threads "$threads" "$dir/a.tz" --against "$file") || rc=1
        echo "round $r $v: compress $c | decompress $d | verify --against $v2"
    done
done
rm -f "$dir/a.tz" "$dir/restored" "$dir/time.txt"
exit $rc
