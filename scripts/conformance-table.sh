#!/bin/sh
# Prints the conformance results of a `go test -v` log as a table: one row
# per case, one column per backend (a TestConformance* suite's, such as
# TestConformanceAPITCP, each backend of TestParity and the parity
# comparison itself), "pass",
# "FAIL", "skip" or "-" when the case did not run there. Exits 1 when any
# cell is FAIL.
#
# With -r it prints the records instead, "backend<TAB>case<TAB>outcome".
#
# Usage: scripts/conformance-table.sh [-r] LOG
set -eu
records=0
[ "${1:-}" = -r ] && { records=1; shift; }
log=${1:?usage: conformance-table.sh [-r] LOG}
sed -n 's/^ *--- \(PASS\|FAIL\|SKIP\): \(TestConformance[A-Za-z0-9]*\|TestParity[A-Za-z]*\)\/\([^ ]*\) .*/\1\t\2\t\3/p' "$log" |
awk -F'\t' -v records=$records '
	{
		outcome = $1 == "PASS" ? "pass" : $1 == "FAIL" ? "FAIL" : "skip"
		name = $3
		if ($2 ~ /^TestParity/) {
			group = tolower(substr($2, 11)); if (group != "") group = "-" group
			n = split(name, part, "/")
			if (part[n] ~ /^(api|cli|kube)(-exec)?$/) {
				backend = "parity" group ":" part[n]; sub("/" part[n] "$", "", name)
			} else backend = "parity" group
		} else { backend = $2; sub("^TestConformance", "", backend) }
		if (!(backend in seenb)) { seenb[backend] = 1; backends[nb++] = backend }
		if (!(name in seenc)) { seenc[name] = 1; cases[nc++] = name }
		cell[name, backend] = outcome
		if (outcome == "FAIL") failed = 1
		if (records) printf "%s\t%s\t%s\n", backend, name, outcome
	}
	END {
		if (records) exit failed
		if (nc == 0) { print "conformance: no results in the log"; exit 0 }
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
	}'
