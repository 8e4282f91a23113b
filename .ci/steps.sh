# What the .ci setup scripts share: timed log lines, a fatal error, and quiet steps.
# Set SETUP (the script's name in its messages) and STEP_LOGS (a directory for each
# step's output) before sourcing this file.
T0=$SECONDS

log() { printf '[%s %3ds] %s\n' "$SETUP" "$((SECONDS - T0))" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$SETUP" "$*" >&2; exit 1; }
# run NAME CMD...: run quietly with output in $STEP_LOGS/NAME.log; show its tail on failure.
run() {
    local name="$1"; shift
    local out="$STEP_LOGS/$name.log"
    if ! "$@" >"$out" 2>&1; then
        tail -n 30 "$out" | sed 's/^/    | /' >&2
        die "step '$name' failed: $* (full log: $out)"
    fi
}
