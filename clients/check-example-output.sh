#!/usr/bin/env bash
# check-example-output.sh FILE: checks what a client example printed.
#
# Event lines are "SEQ HH:MM:SS.mmm KIND text"; the example's own lines start
# with "-- ". Checked: seq runs 1, 2, 3, ... with no gap or duplicate, across
# the reattach too; WatchRun resumes after the last seq seen; and these
# milestones come in this order (other events may come between them):
# live events, the hang-up, the reattach, a decision asked and answered with
# DecideRun(RETRY), a second one, the run finishing, and the final status line
# "final status: SUCCEEDED".
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
/^ *[0-9]+ [0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9]+ [a-z_]+/ {
  if ($1 != seq + 1) fail("seq " $1 " after " seq)
  seq = $1; events++; saw($3)
  if (finished) fail("an event after run_finished")
  if ($3 == "run_finished") finished = 1
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
  if (next_want <= n) { printf "%s: never saw %s (milestone %d of %d) in order\n", FILENAME, want[next_want], next_want, n > "/dev/stderr"; bad = 1 }
  if (bad) exit 1
  printf "%s: %d events, seq 1..%d without a gap, every milestone in order, final status SUCCEEDED\n", FILENAME, events, seq
}' "$file"
