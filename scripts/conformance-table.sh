#!/bin/sh
# Prints the conformance log written by vm/vmtest (lines
# "backend<TAB>case<TAB>outcome") as a table: one row per case, one column
# per backend, "pass", "FAIL", "skip" or "-" when the case did not run
# there. Exits 1 when any cell is FAIL.
#
# Usage: scripts/conformance-table.sh LOG
set -eu
log=${1:?usage: conformance-table.sh LOG}
[ -s "$log" ] || { echo "conformance: no results in $log"; exit 0; }
awk -F'\t' '
	!($1 in seenb) { seenb[$1] = 1; backends[nb++] = $1 }
	!($2 in seenc) { seenc[$2] = 1; cases[nc++] = $2 }
	{ cell[$2, $1] = $3; if ($3 == "FAIL") failed = 1 }
	END {
		w = 4
		for (i = 0; i < nc; i++) if (length(cases[i]) > w) w = length(cases[i])
		printf "%-" w "s", "case"
		for (j = 0; j < nb; j++) { cw[j] = length(backends[j]) < 4 ? 4 : length(backends[j]); printf "  %-" cw[j] "s", backends[j] }
		printf "\n"
		for (i = 0; i < nc; i++) {
			printf "%-" w "s", cases[i]
			for (j = 0; j < nb; j++) {
				c = cell[cases[i], backends[j]]
				if (c == "") c = "-"
				printf "  %-" cw[j] "s", c
			}
			printf "\n"
		}
		exit failed
	}' "$log"
