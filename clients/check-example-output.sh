#!/usr/bin/env bash
# check-example-output.sh FILE: checks what a client example printed.
#
# Event lines are "SEQ HH:MM:SS.mmm KIND text"; the example's own lines start
# with "-- ". An attempt's streamed text (attempt_output) is a block: the
# first piece's event line, "KIND" attempt_output and the text after "| ",
# then the text's further lines, each starting with spaces and "|", then
# "-- attempt N streamed B bytes in seq F-L" (the events the block held; a
# nested control's attempt is "[PATH] attempt N").
# Checked: seq runs 1, 2, 3, ... with no gap or duplicate, across the
# reattach and the blocks too; a block ends before any other line; WatchRun
# resumes after the last seq seen; and these milestones come in this order
# (other events may come between them): live events, the hang-up, the
# reattach, a decision asked and answered with DecideRun(RETRY), a second
# one, the run finishing, and the final status line "final status:
# SUCCEEDED".
set -euo pipefail
file=$1

awk '
BEGIN {
  n = split("run_started attempt_started HANGUP REATTACH attempt_finished decision_requested DECIDE decision_received " \
            "attempt_started decision_requested DECIDE decision_received attempt_started attempt_finished run_finished FINAL", want, " ")
  next_want = 1; seq = 0; bad = 0; events = 0
}
function saw(token) { if (next_want <= n && want[next_want] == token) next_want++ }
function fail(msg) { printf "line %d: %s: %s\n", NR, msg, $0 > "/dev/stderr"; bad = 1 }
block && /^ +\|( |$)/ { next }
block && /^-- (\[[^]]*\] )?attempt [0-9]+ streamed [0-9]+ bytes in seq [0-9]+-[0-9]+$/ {
  split($NF, r, "-"); match($0, /(\[[^]]*\] )?attempt [0-9]+/)
  if (substr($0, RSTART, RLENGTH) != block_of) fail("the output block of " block_of " ends as another")
  if (r[1] != block || r[2] < r[1]) fail("the block began at seq " block)
  events += r[2] - r[1]; seq = r[2]; block = 0; next
}
block { fail("a line inside the output block of " block_of); block = 0 }
/^ *[0-9]+ [0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9]+ [a-z_]+/ {
  if ($1 != seq + 1) fail("seq " $1 " after " seq)
  seq = $1; events++; saw($3)
  if (finished) fail("an event after run_finished")
  if ($3 == "run_finished") finished = 1
  if ($3 == "attempt_output") {
    if (!match($0, /attempt_output +(\[[^]]*\] )?attempt [0-9]+/)) fail("attempt_output names no attempt")
    block = seq; block_of = substr($0, RSTART, RLENGTH); sub(/^attempt_output +/, "", block_of)
  }
  next
}
/^-- hung up after seq [0-9]+/ {
  split($0, w, /[ ;]+/)
  if (w[6] != seq) fail("hung up after seq " w[6] ", last seen " seq)
  saw("HANGUP"); next
}
/^-- reattaching: WatchRun\(/ {
  if (!match($0, /after_seq=[0-9]+/)) { fail("no after_seq"); next }
  after = substr($0, RSTART + 10, RLENGTH - 10)
  if (after != seq) fail("reattached after_seq=" after ", last seen " seq)
  saw("REATTACH"); next
}
/^-- DecideRun\(RETRY\)/ { saw("DECIDE"); next }
/^final status: SUCCEEDED / { saw("FINAL"); next }
/^final status:/ { fail("final status is not SUCCEEDED"); next }
{ fail("unexpected line") }
END {
  if (block) { printf "%s: the output block of %s never ends\n", FILENAME, block_of > "/dev/stderr"; bad = 1 }
  if (next_want <= n) { printf "%s: never saw %s (milestone %d of %d) in order\n", FILENAME, want[next_want], next_want, n > "/dev/stderr"; bad = 1 }
  if (bad) exit 1
  printf "%s: %d events, seq 1..%d without a gap, every milestone in order, final status SUCCEEDED\n", FILENAME, events, seq
}' "$file"
