#!/usr/bin/env bash
# tests/faults_campaign.sh - the fault campaign of `make test-faults`: every
# script that injects faults, each run through tests/run (FAULT_ROUNDS kill -9
# and SIGTERM rounds, MPI_SIGTERM_TRIALS signals to mpirun), then one table:
# per kind of fault, the cases injected, the cases where the run or the
# user's files came through as the test demands (held), and those that did
# not (lost: a failed case, data or a file lost). `make test` runs the same
# scripts with fewer rounds; this is the long form whose table a release
# note quotes. Exit status 1 when any case was lost.
set -u
cd "$(dirname "$0")/.."
export FAULT_ROUNDS=${FAULT_ROUNDS:-15} MPI_SIGTERM_TRIALS=${MPI_SIGTERM_TRIALS:-10}

# script | the faults it injects
CASES=(
	"=faults|kill -9 and SIGTERM at random steps, full and read-only disks, damaged checkpoints, two trainers on one folder, user files in the run folder, overwrites"
	"=mpi_sigterm|SIGTERM to mpirun at random moments (pipelines and replicas)"
	"=mpi_stop_late|SIGTERM to one rank while the last checkpoint is written"
	"=mpi_pipeline|MPI rank killed mid-run, resumed"
	"=tcp_pipeline|TCP rank killed mid-run and while saving"
	"=signals|SIGINT/SIGTERM/SIGHUP while writing shards and folders"
	"=diverge|diverging runs: skipped steps, loss spikes, rollback"
	"=nonfinite_doors|NaN and infinite weights at every reader"
	"=ckpt_meta|checkpoint metadata edited field by field"
	"fuzz_|saved fuzz inputs replayed into every reader"
)

total_cases=0 total_held=0 total_lost=0 total_skipped=0
rows=()
log=$(mktemp "${TMPDIR:-/tmp}/faults-campaign.XXXXXX")
trap 'rm -f "$log"' EXIT
for c in "${CASES[@]}"; do
	name=${c%%|*} what=${c#*|} # =NAME: that script alone (tests/run)
	echo "== $name: $what"
	bash tests/run "$name" > "$log" 2>&1
	grep -E '^  ([^ ]+: )?(FAIL|# )|^  \| ' "$log" | sed 's/^/  /'
	last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
	p=$(echo "$last" | sed -E 's/^([0-9]+) passed.*/\1/')
	f=$(echo "$last" | sed -E 's/.* ([0-9]+) failed.*/\1/')
	s=$(echo "$last" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p')
	p=${p:-0} f=${f:-1} s=${s:-0}
	echo "  $last"
	rows+=("| $what | ${name#=} | $((p + f)) | $p | $f | $s |")
	total_cases=$((total_cases + p + f)) total_held=$((total_held + p))
	total_lost=$((total_lost + f)) total_skipped=$((total_skipped + s))
done

echo
echo "fault campaign (FAULT_ROUNDS=$FAULT_ROUNDS, MPI_SIGTERM_TRIALS=$MPI_SIGTERM_TRIALS, $(date -u +%F))"
echo "| faults injected | script | cases | held | lost | skipped |"
echo "|---|---|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
echo "| **all** | | **$total_cases** | **$total_held** | **$total_lost** | $total_skipped |"
echo
echo "$total_held passed, $total_lost failed, $total_skipped skipped"
[ "$total_lost" -eq 0 ]
