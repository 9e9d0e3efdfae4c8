#!/usr/bin/env bash
# Jobs across hosts: 8 network namespaces h1..h8 (10.77.N.1 to 10.77.N.8, names in each one's
# /etc/hosts) on a bridge, real processes of the example programs in them, no bind variable set
# anywhere; most cases use the first 4. Needs root and iproute2; skips (exit 77, ctest's
# SKIP_RETURN_CODE) where namespaces cannot be made.
#
#   tests/hosts/hosts_test.sh BUILD_DIR [CASE...]      every case, or those named
#   tests/hosts/hosts_test.sh BUILD_DIR serial|elastic  one group (ctest's hosts, hosts.elastic)
#   COHORT_HOSTS_VERBOSE=1 shows every process's output, also of the cases that pass.
#
# Cases: launches (MultiWorkerMirrored 4x1 and 2x2 under TF_CONFIG, COHORT_*, MASTER_ADDR-style
# variables, 8 hosts x 1 and 4 hosts x 2 processes under COHORT_*, Slurm's and mpirun with a
# hostfile, ParameterServer<Sync> on 2 server and 2 worker hosts), each checked for the bits of
# the single-host run (examples/00_mirrored_cpu with as many replicas; 4 hosts x 2 in bfloat16
# against one process of 8 replicas in bfloat16); 2 ranks on each of 2 hosts
# with the master given by a name that is 127.0.1.1 on its own host, as Debian's /etc/hosts has
# it; local ranks learned at the rendezvous (2 ranks on each of 2 hosts), and local variables that
# contradict it (a ConfigError on every rank); and faults: a partition of one host shorter than
# the timeout (same bits), one longer than the timeout (a named error on every rank between half
# and twice the timeout after the fault), one host cut off for good from an elastic job (the
# others go on to the same bits), a worker of 2 hosts of 2 workers by host killed at a random point
# of an elastic job (the 3 left go on to the same bits), a worker of an elastic job killed on its
# host and started there
# again (it rejoins across the hosts, to the same bits), the same for rank 0 of 2 hosts of 2
# workers (rank 1, on its host, keeps the job's door at the master address; the process that
# joins comes last, and the four take the order of their hosts and go by host again), the same
# for rank 0 of 4 hosts of one worker, killed or its host cut off (the next chief opens the door
# at the master port of its own host, and a process started again finds it there among the job's
# hosts, from COHORT_HOSTS or TF_CONFIG, also a chief's pod started again with its TF_CONFIG
# alone, on another host or its own), the same for a pod of a PyTorchJob (the operator's
# variables, the pod started again with them) and for a Slurm task (a replacement step of one
# task, as docs/launching.md gives it), a second host lost while
# the workers left take the newest state (the two left regroup again, to the same bits), a worker
# of an asynchronous parameter-server job of 4 worker and 2 server hosts killed on its host and its
# pod started again with its TF_CONFIG (it takes its place back at both servers, and each of its
# steps reaches them once), a worker host of a synchronous parameter-server job cut off until the
# timeout (the job goes on without it) and its pod started again (the job takes it in, to the
# same bits), the chief's host likewise, a worker's pod started again where it reaches the
# chief's host alone (its grow fails on every process, and the job goes on without it, then takes
# in its pod started again once it reaches every host, to the same bits), a wrong secret on one
# host, no rank 0 at the master address.
set -uo pipefail

build="$(cd "${1:?usage: hosts_test.sh BUILD_DIR [serial|elastic|CASE...]}" && pwd)"
shift
# Two groups. serial: the launches, the partitions (whose errors must come between half and twice
# the timeout), a second loss timed against a transfer, and the refusals, which ctest runs alone.
# elastic: the jobs that go on through a loss and take a process back, whose faults come in the
# middle of paced jobs and are told apart by their lines, not their times; ctest runs them beside
# another test (they pass beside two busy loops).
serial_cases=(tf_config_4x1 tf_config_names_2x2 cohort_4x1 cohort_two_per_host cohort_8x1 cohort_4x2
              cohort_4x2_bf16 local_conflict master_addr_2x2 names_two_per_host slurm_4x1
              mpirun_4x1 mpirun_two_per_host parameter_server short_partition long_partition
              elastic_lost_while_state_travels no_master wrong_secret)
elastic_cases=(elastic_host_lost elastic_by_host_lost elastic_host_rejoins
               elastic_pytorchjob_rejoins elastic_slurm_replacement elastic_chief_rejoins
               elastic_chief_lost_across_hosts
               elastic_chief_host_lost_tf_config elastic_chief_pod_restarts ps_worker_pod_restarts
               ps_sync_host_lost_rejoins ps_sync_chief_host_lost_rejoins
               ps_sync_newcomer_unreachable)
case "${1:-}" in
  "") cases=("${serial_cases[@]}" "${elastic_cases[@]}") ;;
  serial) cases=("${serial_cases[@]}") ;;
  elastic) cases=("${elastic_cases[@]}") ;;
  *) cases=("$@") ;;
esac

multi_worker="${build}/examples/02_multi_worker/multi_worker"
parameter_server="${build}/examples/03_parameter_server/parameter_server"
mirrored="${build}/examples/00_mirrored_cpu/mirrored_cpu"
# A small job: 16 steps of the demo.
job=(--examples 4096 --epochs 1 --quiet)

skip() {
  echo "SKIPPED hosts: $*"
  exit 77
}
# shellcheck source-path=SCRIPTDIR source=../../scripts/lib/hosts.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/hosts.sh"
net="${HOSTS_NET}"
namespace() { hosts_namespace "$1"; }
work="$(mktemp -d)"

cleanup() {
  hosts_destroy
  rm -rf "${work}"
}
trap cleanup EXIT
hosts_create 8 || skip "${HOSTS_PROBLEM}"

failures=0
fail() {
  echo "FAIL ${case_name}: $*"
  failures=$((failures + 1))
}

# on HOST VARIABLES... -- PROGRAM ARGS...: runs in the background in host HOST's namespace with
# exactly the given cohort variables; its output goes to ${work}/<case>.<n>.out, and
# ${work}/<case>.<n>.end gets "status seconds-since-epoch" when it ends.
started=()
on() {
  local host="$1"
  shift
  local variables=()
  while [[ "$1" != "--" ]]; do
    variables+=("$1")
    shift
  done
  shift
  local n="${#started[@]}"
  local out="${work}/${case_name}.${n}"
  (
    env -u COHORT_BIND_ADDRESS -u COHORT_SECRET -u COHORT_TIMEOUT -u COHORT_CONNECT_TIMEOUT \
      "${variables[@]}" ip netns exec "$(namespace "${host}")" "$@" >"${out}.out" 2>&1
    echo "$? $(date +%s.%N)" >"${out}.end"
  ) &
  started+=("${out}")
}

# Waits for every process of the case (at most $1 seconds); prints each one's output on failure.
finish() {
  local limit="$1" waited=0 out
  for out in "${started[@]}"; do
    while [[ ! -f "${out}.end" ]] && ((waited < limit * 10)); do
      sleep 0.1
      waited=$((waited + 1))
    done
  done
  wait
  for out in "${started[@]}"; do
    [[ -f "${out}.end" ]] || fail "$(basename "${out}") did not end within ${limit} s"
  done
}

status_of() { cut -d' ' -f1 "$1.end" 2>/dev/null || echo none; }
end_of() { cut -d' ' -f2 "$1.end"; }

show() {
  local out
  for out in "${started[@]}"; do
    echo "--- $(basename "${out}") (status $(status_of "${out}"))"
    cat "${out}.out"
  done
}

# The chief's fingerprint, from its "parameters HEX" line.
fingerprint() { grep -o 'parameters [0-9a-f]*' "${started[0]}.out" | tail -1 | cut -d' ' -f2; }

# succeeded_with PARAMETERS OUT...: each process OUT exited 0, and the chief's parameters are
# PARAMETERS.
succeeded_with() {
  local expected="$1" out
  shift
  for out in "$@"; do
    [[ "$(status_of "${out}")" == 0 ]] || fail "$(basename "${out}") exited $(status_of "${out}")"
  done
  [[ "$(fingerprint)" == "${expected}" ]] || fail "parameters $(fingerprint), expected ${expected}"
}

# Every process of the case exited 0, and the chief's parameters are $1.
expect_success() { succeeded_with "$1" "${started[@]}"; }

# The same, with no rank on the wildcard address and no segment shared across hosts.
expect_bits() {
  expect_success "$1"
  grep -q "COHORT_BIND_ADDRESS\|0\.0\.0\.0" "${started[@]/%/.out}" &&
    fail "a rank bound the wildcard or read COHORT_BIND_ADDRESS"
  # Each host has a network namespace of its own: workers of different hosts reach each other
  # over TCP, never through one shared segment.
  grep -q "of this host all-reduce through shared memory" "${started[@]/%/.out}" &&
    fail "workers on different hosts all-reduced through one shared segment"
}

# The single-host bits, Mirrored with 2 and 4 replicas.
reference() {
  "${mirrored}" --replicas "$1" "${job[@]}" | awk -v n="$1" '$1 == n { print $5 }'
}
bits2="$(reference 2)"
bits4="$(reference 4)"
bits8="$(reference 8)"
echo "single-host parameters: 2 replicas ${bits2}, 4 replicas ${bits4}, 8 replicas ${bits8}"
[[ -n "${bits2}" && -n "${bits4}" && -n "${bits8}" ]] ||
  { echo "FAIL: no single-host fingerprint"; exit 1; }

tf_config() {  # tf_config "\"h1:2222\",..." TYPE INDEX [PS_LIST]
  local ps=""
  [[ -n "${4:-}" ]] && ps=",\"ps\":[$4]"
  echo "{\"cluster\":{\"worker\":[$1]${ps}},\"task\":{\"type\":\"$2\",\"index\":$3}}"
}

case_tf_config_4x1() {
  local workers="\"${net}.1:2222\",\"${net}.2:2222\",\"${net}.3:2222\",\"${net}.4:2222\"" h
  for h in 1 2 3 4; do
    on "${h}" TF_CONFIG="$(tf_config "${workers}" worker $((h - 1)))" -- \
      "${multi_worker}" "${job[@]}"
  done
  finish 60
  expect_bits "${bits4}"
  grep -q "listening on ${net}.2 (own address in TF_CONFIG worker\[1\])" "${started[1]}.out" ||
    fail "rank 1's start-up line does not name its own address"
  grep -q "warning: listening on ${net}.1 without a secret" "${started[0]}.out" ||
    fail "no warning about the missing secret"
}

case_tf_config_names_2x2() {
  local workers='"h1:2222","h2:2222"' h
  for h in 1 2; do
    on "${h}" TF_CONFIG="$(tf_config "${workers}" worker $((h - 1)))" -- \
      "${multi_worker}" --local-replicas 2 "${job[@]}"
  done
  finish 60
  # Each host's own name is 127.0.1.1 there: it listens on every interface and says why.
  local out
  for out in "${started[@]}"; do
    [[ "$(status_of "${out}")" == 0 ]] || fail "$(basename "${out}") exited $(status_of "${out}")"
    grep -q "listening on 0.0.0.0 (every interface: own address in TF_CONFIG worker\[.\] is" \
      "${out}.out" || fail "$(basename "${out}") does not say why it binds every interface"
  done
  [[ "$(fingerprint)" == "${bits4}" ]] || fail "parameters $(fingerprint), expected ${bits4}"
}

# A job of $1 ranks, $2 on each host, under COHORT_* variables without local ones: the bits of the
# single host ($3), its last rank learned its local rank at the rendezvous, and with several ranks
# on a host it all-reduced by host.
cohort_job() {
  local ranks="$1" per_host="$2" bits="$3" rank
  for ((rank = 0; rank < ranks; ++rank)); do
    on $((rank / per_host + 1)) COHORT_RANK="${rank}" COHORT_WORLD_SIZE="${ranks}" \
      COHORT_MASTER_ADDR=${net}.1 COHORT_MASTER_PORT=29500 -- "${multi_worker}" "${job[@]}"
  done
  finish 90
  expect_bits "${bits}"
  local last=$((ranks - 1))
  grep -q "rank ${last} is local rank $((last % per_host)) of ${per_host}, from the rendezvous \
(ranks of its role at ${net}.$((last / per_host + 1)))" "${started[last]}.out" ||
    fail "rank ${last} did not learn local rank $((last % per_host)) of ${per_host}"
  # Several ranks on a host all-reduce by host: through its memory, and between hosts over TCP.
  if ((per_host > 1)); then
    grep -q "the ${per_host} worker processes of each of $((ranks / per_host)) hosts all-reduce \
through shared memory, and between the hosts" "${started[0]}.out" ||
      fail "rank 0 does not say that the job all-reduces by host"
  fi
}

case_cohort_4x1() { cohort_job 4 1 "${bits4}"; }
case_cohort_two_per_host() { cohort_job 4 2 "${bits4}"; }  # 4 ranks on 2 hosts
case_cohort_8x1() { cohort_job 8 1 "${bits8}"; }
case_cohort_4x2() { cohort_job 8 2 "${bits8}"; }  # 4 hosts of 2 processes each

case_cohort_4x2_bf16() {  # the same in bfloat16: the bits of one process of 8 replicas in bfloat16
  local rank bits
  bits="$(COHORT_WIRE=bf16 "${multi_worker}" --local-replicas 8 "${job[@]}" 2>&1 |
    grep -o 'parameters [0-9a-f]*' | cut -d' ' -f2)"
  [[ -n "${bits}" && "${bits}" != "${bits8}" ]] || fail "no bfloat16 reference of its own: ${bits}"
  for ((rank = 0; rank < 8; ++rank)); do
    on $((rank / 2 + 1)) COHORT_RANK="${rank}" COHORT_WORLD_SIZE=8 COHORT_WIRE=bf16 \
      COHORT_MASTER_ADDR="${net}.1" COHORT_MASTER_PORT=29500 -- "${multi_worker}" "${job[@]}"
  done
  finish 90
  expect_bits "${bits}"
  grep -q "of each of 4 hosts all-reduce through shared memory" "${started[0]}.out" ||
    fail "rank 0 does not say that the job all-reduces by host"
}

case_local_conflict() {  # local variables that say one host, for ranks on four
  local h
  for h in 1 2 3 4; do
    on "${h}" COHORT_RANK=$((h - 1)) COHORT_WORLD_SIZE=4 COHORT_LOCAL_RANK=$((h - 1)) \
      COHORT_LOCAL_WORLD_SIZE=4 COHORT_MASTER_ADDR=${net}.1 COHORT_MASTER_PORT=29500 -- \
      "${multi_worker}" "${job[@]}"
  done
  finish 60
  local out
  for out in "${started[@]}"; do
    [[ "$(status_of "${out}")" == 2 ]] || fail "$(basename "${out}") exited $(status_of "${out}")"
    grep -q "error: local ranks: mesh rank 0 was given local rank 0 of 4 (COHORT_\* variables), \
but at the rendezvous 1 rank(s) of its role share its address ${net}.1" \
      "${out}.out" || fail "$(basename "${out}") does not name the conflict"
  done
}

case_master_addr_2x2() {
  local h
  for h in 1 2; do
    on "${h}" RANK=$((h - 1)) WORLD_SIZE=2 MASTER_ADDR=h1 MASTER_PORT=29500 -- \
      "${multi_worker}" --local-replicas 2 "${job[@]}"
  done
  finish 60
  # h1 is 127.0.1.1 on h1 (the master's own name), h1's address on h2.
  grep -q "listening on ${net}.2 (own address on the route to the master h1)" "${started[1]}.out" ||
    fail "rank 1 does not bind its own address"
  expect_success "${bits4}"
}

case_names_two_per_host() {  # 2 ranks on each of 2 hosts, the master by its name
  local rank
  for rank in 0 1 2 3; do
    on $((rank / 2 + 1)) RANK="${rank}" WORLD_SIZE=4 MASTER_ADDR=h1 MASTER_PORT=29500 -- \
      "${multi_worker}" "${job[@]}"
  done
  finish 60
  # On h1, h1 is 127.0.1.1: rank 1 reaches rank 0 over loopback and listens on every interface;
  # the others reach it at h1's address.
  grep -q "listening on 0.0.0.0" "${started[1]}.out" ||
    fail "rank 1 does not bind every interface"
  expect_success "${bits4}"
  grep -q "rank 3 is local rank 1 of 2, from the rendezvous" "${started[3]}.out" ||
    fail "rank 3 did not learn local rank 1 of 2"
}

case_slurm_4x1() {  # the variables srun gives each task of a 4-node, 1-task-per-node step
  local h
  for h in 1 2 3 4; do
    on "${h}" SLURM_PROCID=$((h - 1)) SLURM_NTASKS=4 SLURM_LOCALID=0 SLURM_NODEID=$((h - 1)) \
      SLURM_STEP_TASKS_PER_NODE='1(x4)' SLURM_STEP_NODELIST='h[1-4]' SLURM_JOB_ID=77 -- \
      "${multi_worker}" "${job[@]}"
  done
  finish 60
  expect_success "${bits4}"
  grep -q "listening on ${net}.4 (own address on the route to the master h1)" "${started[3]}.out" ||
    fail "rank 3 does not bind its own address"
}

# mpirun with a hostfile of the hosts' addresses, as on a cluster: Open MPI's ssh is replaced by
# an agent that runs the remote command (its daemon, orted) in the host's namespace, and mpirun
# reaches the daemons through an address of the bridge. $1: slots per host, $2: hosts.
mpirun_hostfile() {
  local slots="$1" hosts="$2" h
  command -v mpirun >/dev/null || {
    echo "SKIPPED ${case_name}: no mpirun"
    return 1
  }
  hosts_mpirun_agent "${work}"
  : >"${work}/hostfile"
  for ((h = 1; h <= hosts; ++h)); do echo "${net}.${h} slots=${slots}" >>"${work}/hostfile"; done
  hosts_bridge_address on
  local out="${work}/${case_name}.0"
  started=("${out}")
  env -u COHORT_BIND_ADDRESS -u COHORT_SECRET \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 \
    mpirun --hostfile "${work}/hostfile" -np $((slots * hosts)) \
    --mca plm_rsh_agent "${work}/agent" --mca oob_tcp_if_include "${net}.0/24" \
    -x COHORT_MASTER_ADDR="${net}.1" -x COHORT_MASTER_PORT=29500 \
    "${multi_worker}" "${job[@]}" >"${out}.out" 2>&1
  echo "$? $(date +%s.%N)" >"${out}.end"
  hosts_bridge_address off
}

case_mpirun_4x1() {
  mpirun_hostfile 1 4 || return
  expect_bits "${bits4}"
  grep -q "rank 2 of 4 (local 0 of 1).*listening on ${net}.3 (own address on the route to the" \
    "${started[0]}.out" || fail "rank 2 does not bind its own address"
}

case_mpirun_two_per_host() {  # Open MPI's local ranks, 2 per host, agree with the rendezvous
  mpirun_hostfile 2 2 || return
  expect_bits "${bits4}"
  grep -q "rank 3 of 4 (local 1 of 2).*listening on ${net}.2" "${started[0]}.out" ||
    fail "rank 3 is not local rank 1 of 2 on host 2"
}

case_parameter_server() {
  local workers="\"${net}.1:2222\",\"${net}.2:2222\"" ps="\"${net}.3:2222\",\"${net}.4:2222\""
  local program=("${parameter_server}" --micro-batches 8 "${job[@]}")
  on 1 TF_CONFIG="$(tf_config "${workers}" worker 0 "${ps}")" -- "${program[@]}"
  on 2 TF_CONFIG="$(tf_config "${workers}" worker 1 "${ps}")" -- "${program[@]}"
  on 3 TF_CONFIG="$(tf_config "${workers}" ps 0 "${ps}")" -- "${program[@]}"
  on 4 TF_CONFIG="$(tf_config "${workers}" ps 1 "${ps}")" -- "${program[@]}"
  finish 60
  expect_bits "${bits2}"
  grep -q "listening on ${net}.4 (own address in TF_CONFIG ps\[1\])" "${started[3]}.out" ||
    fail "server 1 does not bind its own address"
}

# A job that would run for minutes, for the long partition.
endless_job=(--layers "8,512,512,10" --examples 32768 --epochs 1000 --quiet)
# An elastic job's (256 steps), also the short partition's, and its bits on one host.
elastic_job=(--layers "8,512,512,10" --examples 32768 --epochs 2 --quiet)
elastic_bits4="$("${mirrored}" --replicas 4 "${elastic_job[@]}" | awk '$1 == 4 { print $5 }')"
# The elastic jobs' processes get each replica's micro-batches at most one every 10 ms (the
# demos' --input-ms), so that a job lasts at least steps x micro-batches per worker x 10 ms
# however fast the machine (elastic_job on 4 workers: 5 s): a fault a second after its start
# lands in its middle, and a process started again after it finds the job still running.
paced=(--input-ms 10)

# lines_at_least COUNT PATTERN FILE...: waits until the files have COUNT lines matching PATTERN
# in all (30 s at most); fails if they do not.
lines_at_least() {
  local count="$1" pattern="$2" waited=0
  shift 2
  until (($(cat "$@" 2>/dev/null | grep -c "${pattern}") >= count)); do
    ((waited < 300)) || return 1
    sleep 0.1
    waited=$((waited + 1))
  done
}

# logged OUT PATTERN: waits until process OUT's output has a line matching PATTERN (30 s at most),
# and prints the match.
logged() {
  local waited=0
  until grep -o "$2" "$1.out" 2>/dev/null; do
    ((waited < 300)) || return 1
    sleep 0.1
    waited=$((waited + 1))
  done
}

# Waits until $1 processes of the case said where they listen (30 s at most), then 1 s more: the
# job is training.
wait_until_training() {
  lines_at_least "$1" "listening on" "${started[@]/%/.out}" || true
  sleep 1
}

# Starts the 4x1 COHORT_* job of the partitions with COHORT_TIMEOUT=$1 and the demo settings
# ${@:2}, and waits until every rank has started training.
start_partition_job() {
  local h
  for h in 1 2 3 4; do
    on "${h}" COHORT_RANK=$((h - 1)) COHORT_WORLD_SIZE=4 COHORT_MASTER_ADDR=${net}.1 \
      COHORT_MASTER_PORT=29500 COHORT_TIMEOUT="$1" -- "${multi_worker}" "${@:2}"
  done
  wait_until_training 4
}

case_short_partition() {
  start_partition_job 10 "${elastic_job[@]}" "${paced[@]}"
  ip link set "$(hosts_link 4)" down
  sleep 3
  ip link set "$(hosts_link 4)" up
  local healed
  healed="$(date +%s.%N)"
  finish 120
  expect_bits "${elastic_bits4}"
  # The job was still running when the partition ended, so the partition was within it.
  awk -v a="$(end_of "${started[0]}")" -v b="${healed}" 'BEGIN { exit !(a > b) }' ||
    fail "the job ended before the partition did: pace it slower"
}

case_long_partition() {
  local timeout=4
  start_partition_job "${timeout}" "${endless_job[@]}"
  local fault
  fault="$(date +%s.%N)"
  ip link set "$(hosts_link 4)" down
  finish 60
  ip link set "$(hosts_link 4)" up
  local out after
  for out in "${started[@]}"; do
    [[ "$(status_of "${out}")" != 0 ]] ||
      fail "$(basename "${out}") succeeded despite the partition"
    grep -q "error: .*rank [0-9]" "${out}.out" || fail "$(basename "${out}") names no rank"
    after="$(awk -v a="$(end_of "${out}")" -v f="${fault}" 'BEGIN { printf "%.1f", a - f }')"
    echo "${case_name}: $(basename "${out}") failed ${after} s after the fault" \
      "(timeout ${timeout} s)"
    # Found silent at the deadline (its own, or quoted from the rank that left first), not ended
    # by anything else.
    grep -qE "no progress within [0-9]+ ms" "${out}.out" ||
      fail "$(basename "${out}") does not say it found no progress within the deadline"
  done
}

# went_on_without_rank_3 PARAMETERS OUT...: each process OUT exited 0, the chief's parameters are
# PARAMETERS, and it said that the job went on without rank 3.
went_on_without_rank_3() {
  succeeded_with "$@"
  grep -q "cohort: workers 4 -> 3 at step .*(rank 3 lost: " "${started[0]}.out" ||
    fail "the chief does not say the job went on without rank 3"
}

case_elastic_host_lost() {  # an elastic job of 4 hosts, one cut off for good: the others go on
  COHORT_MIN_WORKERS=3 start_partition_job 4 "${elastic_job[@]}" "${paced[@]}"
  ip link set "$(hosts_link 4)" down
  finish 120
  ip link set "$(hosts_link 4)" up
  went_on_without_rank_3 "${elastic_bits4}" "${started[@]:0:3}"
  # The host cut off finds nobody at the roll call, and stops below min_workers.
  [[ "$(status_of "${started[3]}")" != 0 ]] || fail "the host cut off succeeded"
  grep -q "regroup: 1 of 4 ranks answer" "${started[3]}.out" ||
    fail "the host cut off does not say it stopped below min_workers"
}

case_elastic_by_host_lost() {  # 2 hosts of 2 workers by host: rank 3 killed at a random point
  local rank pid
  for rank in 0 1 2 3; do
    on $((rank / 2 + 1)) COHORT_RANK="${rank}" COHORT_WORLD_SIZE=4 "COHORT_MASTER_ADDR=${net}.1" \
      COHORT_MASTER_PORT=29500 COHORT_TIMEOUT=4 COHORT_MIN_WORKERS=3 COHORT_SHARE_UPDATE_FROM=0 \
      -- "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  done
  wait_until_training 4
  # Each worker updates its stripes of its host's state and keeps a copy of the whole
  # (strategy/detail/keep_schedule.hpp): wherever the kill lands, the 3 left rebuild the newest
  # state every worker kept.
  sleep "0.$((RANDOM % 10))"
  for pid in $(ip netns pids "$(namespace 2)"); do
    tr '\0' '\n' <"/proc/${pid}/environ" 2>/dev/null | grep -qx COHORT_RANK=3 && kill -9 "${pid}"
  done
  finish 120
  grep -q "the 2 worker processes of each of 2 hosts all-reduce through shared memory" \
    "${started[0]}.out" || fail "the chief does not say that the 4 workers went by host"
  went_on_without_rank_3 "${elastic_bits4}" "${started[@]:0:3}"
}

case_elastic_host_rejoins() {  # an elastic job of 4 hosts: host 4's worker killed, started again
  local pid
  COHORT_MIN_WORKERS=3 start_partition_job 4 "${elastic_job[@]}" "${paced[@]}"
  for pid in $(ip netns pids "$(namespace 4)"); do kill -9 "${pid}"; done
  # The same command on the same host, as a pod's restart policy would start it.
  on 4 COHORT_RANK=3 COHORT_WORLD_SIZE=4 COHORT_MASTER_ADDR=${net}.1 COHORT_MASTER_PORT=29500 \
    COHORT_TIMEOUT=4 COHORT_MIN_WORKERS=3 -- "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  finish 120
  went_on_without_rank_3 "${elastic_bits4}" "${started[@]:0:3}" "${started[4]}"
  grep -q "cohort: workers 3 -> 4 at step .*(1 joined)" "${started[0]}.out" ||
    fail "the chief does not say the job took a worker back"
  grep -q "cohort: rank 3 joined the job of 4 workers at step " "${started[4]}.out" ||
    fail "the worker started again does not say it joined"
}

# The variables Kubernetes' PyTorchJob operator gives each pod (RANK, WORLD_SIZE, MASTER_ADDR: the
# master pod's service name, MASTER_PORT), with COHORT_MIN_WORKERS in the pods' environment: the
# pod of rank 3 fails, and its controller starts it again with the same variables.
case_elastic_pytorchjob_rejoins() {
  local pid h
  local pod=(WORLD_SIZE=4 MASTER_ADDR=h1 MASTER_PORT=23456 COHORT_MIN_WORKERS=3 COHORT_TIMEOUT=4)
  for h in 1 2 3 4; do
    on "${h}" RANK=$((h - 1)) "${pod[@]}" -- "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  done
  wait_until_training 4
  for pid in $(ip netns pids "$(namespace 4)"); do kill -9 "${pid}"; done
  on 4 RANK=3 "${pod[@]}" -- "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  finish 120
  went_on_without_rank_3 "${elastic_bits4}" "${started[@]:0:3}" "${started[4]}"
  grep -q "cohort: workers 3 -> 4 at step .*(1 joined)" "${started[0]}.out" ||
    fail "the chief does not say the job took the pod started again back"
  grep -q "from torchrun variables" "${started[4]}.out" ||
    fail "the pod started again did not read the operator's variables"
}

# Slurm: the job's step of 4 tasks keeps running when one fails (srun --no-kill), and a
# replacement step of one task on that node joins it, as docs/launching.md gives the command:
# srun --ntasks=1 -w h4 env COHORT_JOIN=1 COHORT_RANK=3 COHORT_WORLD_SIZE=4 COHORT_MASTER_ADDR=h1
# COHORT_MASTER_PORT=29500 COHORT_JOB_ID=$SLURM_JOB_ID COHORT_MIN_WORKERS=3 ./train (the variables
# srun gives that task beside them: a step of one task).
case_elastic_slurm_replacement() {
  local pid h
  local allocation=(SLURM_JOB_ID=77 SLURM_JOB_NODELIST='h[1-4]' COHORT_TIMEOUT=4)
  for h in 1 2 3 4; do
    on "${h}" SLURM_PROCID=$((h - 1)) SLURM_NTASKS=4 SLURM_LOCALID=0 SLURM_NODEID=$((h - 1)) \
      SLURM_STEP_TASKS_PER_NODE='1(x4)' SLURM_STEP_NODELIST='h[1-4]' "${allocation[@]}" \
      COHORT_MIN_WORKERS=3 -- "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  done
  wait_until_training 4
  for pid in $(ip netns pids "$(namespace 4)"); do kill -9 "${pid}"; done
  on 4 SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_STEP_TASKS_PER_NODE=1 \
    SLURM_STEP_NODELIST=h4 "${allocation[@]}" COHORT_JOIN=1 COHORT_RANK=3 COHORT_WORLD_SIZE=4 \
    COHORT_MASTER_ADDR=h1 COHORT_MASTER_PORT=29500 COHORT_JOB_ID=77 COHORT_MIN_WORKERS=3 -- \
    "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  finish 120
  went_on_without_rank_3 "${elastic_bits4}" "${started[@]:0:3}" "${started[4]}"
  grep -q "cohort: workers 3 -> 4 at step .*(1 joined)" "${started[0]}.out" ||
    fail "the chief does not say the job took the replacement in"
  grep -q "cohort: rank 3 joined the job of 4 workers at step " "${started[4]}.out" ||
    fail "the replacement does not say it joined"
}

# in_order FILE TEXT...: FILE has a line with each TEXT, in that order.
in_order() {
  local file="$1"
  shift
  awk -v texts="$(printf '%s\n' "$@")" '
    BEGIN { n = split(texts, want, "\n"); k = 1 }
    k <= n && index($0, want[k]) { k++ }
    END { exit (k <= n) }' "${file}"
}

# took_rank_0_back PARAMETERS: every process but the lost rank 0 exited 0, and the next chief,
# rank 1 (started second), said that the job went on without rank 0 and took a process back, and
# ended with PARAMETERS.
took_rank_0_back() {
  local expected="$1" out chief="${started[1]}.out" parameters
  for out in "${started[@]:1}"; do
    [[ "$(status_of "${out}")" == 0 ]] || fail "$(basename "${out}") exited $(status_of "${out}")"
  done
  grep -q "cohort: workers 4 -> 3 at step .*(rank 0 lost: " "${chief}" ||
    fail "the next chief does not say the job went on without rank 0"
  grep -q "cohort: workers 3 -> 4 at step .*(1 joined)" "${chief}" ||
    fail "the next chief does not say the job took a process back"
  parameters="$(grep -o 'parameters [0-9a-f]*' "${chief}" | tail -1 | cut -d' ' -f2)"
  [[ "${parameters}" == "${expected}" ]] ||
    fail "parameters ${parameters}, expected ${expected}"
}

# 4 hosts of one worker: rank 0 killed, so that the next chief, rank 1, is on another host than
# the job's rendezvous address. It opens the job's door at the same port of its own host and says
# so; a process started again on host 1 with rank 0's variables, COHORT_JOIN=1 and the job's hosts
# (COHORT_HOSTS) finds it there by itself, to the same bits.
case_elastic_chief_lost_across_hosts() {
  local pid
  COHORT_MIN_WORKERS=3 start_partition_job 4 "${elastic_job[@]}" "${paced[@]}"
  for pid in $(ip netns pids "$(namespace 1)"); do kill -9 "${pid}"; done
  logged "${started[1]}" "its door is at ${net}.2:29500 from now on" >/dev/null ||
    fail "rank 1, the next chief, does not say that the job's door is at port 29500 of its host"
  on 1 COHORT_JOIN=1 COHORT_RANK=0 COHORT_WORLD_SIZE=4 COHORT_MASTER_ADDR=${net}.1 \
    COHORT_MASTER_PORT=29500 COHORT_HOSTS=h1,h2,h3,h4 COHORT_TIMEOUT=4 COHORT_MIN_WORKERS=3 -- \
    "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  finish 120
  took_rank_0_back "${elastic_bits4}"
}

# chief_started_again_under_tf_config HOST FAULT WHEN JOB...: 4 hosts of one worker under
# TF_CONFIG, training JOB (paced); rank 0 lost by FAULT (kill: its worker killed; cut: host 1's
# link cut for good). The next chief, rank 1, opens the job's door at TF_CONFIG's port on its own
# host. A process started on HOST with task 0's TF_CONFIG alone, as a TFJob's controller starts
# the chief's pod again, WHEN (at_once: right after the fault; door_open: once the door is open),
# finds the job running there by itself and joins; the job ends with the bits of one that lost
# nobody.
chief_started_again_under_tf_config() {
  local host="$1" fault="$2" when="$3" reference h pid
  shift 3
  reference="$("${mirrored}" --replicas 4 "$@" | awk '$1 == 4 { print $5 }')"
  local workers="\"${net}.1:2222\",\"${net}.2:2222\",\"${net}.3:2222\",\"${net}.4:2222\""
  for h in 1 2 3 4; do
    on "${h}" TF_CONFIG="$(tf_config "${workers}" worker $((h - 1)))" COHORT_TIMEOUT=4 \
      COHORT_MIN_WORKERS=3 -- "${multi_worker}" "$@" "${paced[@]}"
  done
  wait_until_training 4
  if [[ "${fault}" == cut ]]; then
    ip link set "$(hosts_link 1)" down
  else
    for pid in $(ip netns pids "$(namespace 1)"); do kill -9 "${pid}"; done
  fi
  local door_line="its door is at ${net}.2:2222 from now on"
  if [[ "${when}" == door_open ]]; then logged "${started[1]}" "${door_line}" >/dev/null || true; fi
  on "${host}" TF_CONFIG="$(tf_config "${workers}" worker 0)" COHORT_TIMEOUT=4 \
    COHORT_MIN_WORKERS=3 -- "${multi_worker}" "$@" "${paced[@]}"
  finish 120
  grep -q "${door_line}" "${started[1]}.out" ||
    fail "rank 1, the next chief, does not say that the job's door is at port 2222 of its host"
  ip link set "$(hosts_link 1)" up
  took_rank_0_back "${reference}"
  grep -q "cohort: rank 0: its job runs already" "${started[4]}.out" ||
    fail "task 0 started again does not say it found its job running"
}

# Host 1 cut off, task 0 started on host 5 at once, before the job notices the cut (its timeout,
# 4 s) and opens its door again: it asks the job's hosts again while it waits, and finds the job
# past host 1, which answers nothing (2 s a round). The job trains an epoch longer than
# elastic_job: it goes on for the cut's timeout, its regroup and the next round.
case_elastic_chief_host_lost_tf_config() {
  chief_started_again_under_tf_config 5 cut at_once --layers "8,512,512,10" --examples 32768 \
    --epochs 3 --quiet
}

# The chief's worker killed and started again on its own host: it finds the door past its own
# port.
case_elastic_chief_pod_restarts() {
  chief_started_again_under_tf_config 1 kill door_open "${elastic_job[@]}"
}

# A second host lost while the workers left take the newest state: on links of 20 Mbit/s the
# state of the MLP 8-512-512-10 (1.1 MB of parameters, 2.2 MB of Adam's moments) travels for about
# a second. Host 4's worker is killed once the fit is past its first step (the chief's progress
# line: the parameters' first broadcast is over), and host 3's 0.2 s after the workers left met
# again (rank 1's second line of its local rank, from the next membership's rendezvous), which is
# when the state begins to travel. The two left regroup again and go on to the same bits.
case_elastic_lost_while_state_travels() {
  local wide_job=(--layers "8,512,512,10" --examples 4096 --epochs 1)
  local reference pid
  reference="$("${mirrored}" --replicas 4 "${wide_job[@]}" --quiet | awk '$1 == 4 { print $5 }')"
  if ! hosts_shape 20mbit; then
    hosts_unshape 2>/dev/null
    echo "SKIPPED ${case_name}: tc cannot shape the links here (no tbf)"
    return
  fi
  COHORT_MIN_WORKERS=2 start_partition_job 8 "${wide_job[@]}" --log-every 1
  logged "${started[0]}" "step 1/16" >/dev/null || fail "the chief did not report its first step"
  for pid in $(ip netns pids "$(namespace 4)"); do kill -9 "${pid}"; done
  lines_at_least 2 "is local rank" "${started[1]}.out" ||
    fail "rank 1 did not meet the workers left"
  sleep 0.2
  for pid in $(ip netns pids "$(namespace 3)"); do kill -9 "${pid}"; done
  finish 120
  hosts_unshape
  succeeded_with "${reference}" "${started[@]:0:2}"
  # Rank 0 holds the newest state and sends it, so it is in the transfer when a receiver is lost
  # (rank 1 may have all of it by then, and meet the loss in the step after).
  grep -q "a worker was lost while the job took the newest state; regrouping again" \
    "${started[0]}.out" || fail "rank 0 lost no worker while the state travelled"
  grep -q "cohort: workers 4 -> 2 at step .*(rank 2, rank 3 lost: " "${started[0]}.out" ||
    fail "the chief does not say the job went on without ranks 2 and 3, as one change"
}

case_elastic_chief_rejoins() {  # 2 hosts of 2 workers: rank 0 killed, started again on its host
  local rank pid
  local elastic=(COHORT_WORLD_SIZE=4 "COHORT_MASTER_ADDR=${net}.1" COHORT_MASTER_PORT=29500
                 COHORT_TIMEOUT=4 COHORT_MIN_WORKERS=3)
  for rank in 0 1 2 3; do
    on $((rank / 2 + 1)) COHORT_RANK="${rank}" "${elastic[@]}" -- \
      "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  done
  wait_until_training 4
  for pid in $(ip netns pids "$(namespace 1)"); do
    tr '\0' '\n' <"/proc/${pid}/environ" 2>/dev/null | grep -qx COHORT_RANK=0 && kill -9 "${pid}"
  done
  # Started again on its host, as cohort-run would: it says that it joins.
  on 1 COHORT_JOIN=1 COHORT_RANK=0 "${elastic[@]}" -- \
    "${multi_worker}" "${elastic_job[@]}" "${paced[@]}"
  finish 120
  took_rank_0_back "${elastic_bits4}"
  # Rank 1, on rank 0's host, is the chief now, and keeps the job's door at the master address.
  grep -q "cohort: rank 0: keeps the job's door at ${net}.1:29500, where its first rank 0 was" \
    "${started[1]}.out" || fail "the next chief does not keep the door at the master address"
  # Three workers cannot go by host; the one that joined comes last, and the four take the order
  # of their hosts, where it is rank 1, and go by host again.
  in_order "${started[1]}.out" "they cannot go by host: host 1 (from rank 1) has 2 ranks" \
    "cohort: workers 4 -> 3 at step" \
    "the workers take the order of their hosts, so that they all-reduce by host" \
    "the 2 worker processes of each of 2 hosts all-reduce through shared memory" \
    "cohort: workers 3 -> 4 at step" ||
    fail "the next chief does not say that the job went flat, then by host again in the order of \
its hosts once the worker joined"
  grep -q "cohort: rank 1 joined the job of 4 workers at step " "${started[4]}.out" ||
    fail "rank 0 started again does not say it joined as rank 1, beside its host's other worker"
}

# ps_pod HOST VARIABLES... -- PROGRAM...: the task of host HOST in a parameter-server job of 4
# worker hosts (1 to 4) and 2 server hosts (5 and 6) under TF_CONFIG, with VARIABLES.
ps_pod() {
  local h=$1 workers="\"${net}.1:2222\",\"${net}.2:2222\",\"${net}.3:2222\",\"${net}.4:2222\""
  local ps="\"${net}.5:2222\",\"${net}.6:2222\"" type=worker index=$(($1 - 1))
  ((h > 4)) && { type="ps"; index=$((h - 5)); }
  on "${h}" TF_CONFIG="$(tf_config "${workers}" "${type}" "${index}" "${ps}")" "${@:2}"
}

# start_ps_hosts VARIABLES... -- PROGRAM...: every task of that job, then waits until it trains.
start_ps_hosts() {
  local h
  for h in 1 2 3 4 5 6; do ps_pod "${h}" "$@"; done
  wait_until_training 6
}

# A TFJob of 4 worker pods and 2 ps pods, asynchronous, elastic: worker 3's pod fails, and its
# controller starts it again with its TF_CONFIG; it takes its place back at both servers, under
# the job's secret.
case_ps_worker_pod_restarts() {
  local pid
  local program=("${parameter_server}" --consistency async --micro-batches 8 "${elastic_job[@]}"
                 "${paced[@]}")
  local elastic=(COHORT_MIN_WORKERS=3 COHORT_SECRET=ps-hosts)
  start_ps_hosts "${elastic[@]}" -- "${program[@]}"
  for pid in $(ip netns pids "$(namespace 4)"); do kill -9 "${pid}"; done
  ps_pod 4 "${elastic[@]}" COHORT_JOIN=1 -- "${program[@]}"
  finish 120
  local out
  for out in "${started[@]:0:3}" "${started[@]:4}"; do
    [[ "$(status_of "${out}")" == 0 ]] || fail "$(basename "${out}") exited $(status_of "${out}")"
  done
  grep -q "cohort: worker 3 took its place back, at step " "${started[6]}.out" ||
    fail "the worker started again does not say it took its place back"
  for out in "${started[@]:4:2}"; do
    grep -q "took back worker 3 (rank 3), started again" "${out}.out" ||
      fail "$(basename "${out}") does not say it took worker 3 back"
    # Each worker's steps reached the server once, worker 3's from both of its processes.
    grep -qE "pushes applied per worker \[([0-9]+), \1, \1, \1\], workers lost 1, taken back 1" \
      "${out}.out" || fail "$(basename "${out}") did not take every worker's steps once"
  done
}

# A synchronous parameter-server job of 4 worker and 2 server hosts, elastic: the link of host $1
# cut (its worker falls silent; the servers count it out at the timeout, and every process left
# regroups), then its pod started again with its TF_CONFIG once the link is back (the chief's
# door takes it in at a step boundary): the bits of a job that lost nobody. Where host 1, the
# chief's, is cut, the next chief opens the door at the job's rendezvous port of its own host,
# where the chief's pod looks among the job's hosts.
ps_sync_host_lost_rejoins() {
  local pid lost=$1 chief
  local program=("${parameter_server}" --consistency sync --micro-batches 8 "${elastic_job[@]}"
                 "${paced[@]}")
  local elastic=(COHORT_MIN_WORKERS=3 COHORT_SECRET=ps-sync-hosts COHORT_TIMEOUT=4)
  start_ps_hosts "${elastic[@]}" -- "${program[@]}"
  # The chief after the loss: worker 0, or worker 1 where worker 0 is lost.
  chief="${started[$((lost == 1 ? 1 : 0))]}"
  ip link set "$(hosts_link "${lost}")" down
  logged "${chief}" "cohort: workers 4 -> 3 at step .*(rank $((lost - 1)) lost: " >/dev/null ||
    fail "the chief does not say the job went on without rank $((lost - 1))"
  for pid in $(ip netns pids "$(namespace "${lost}")"); do kill -9 "${pid}"; done
  ip link set "$(hosts_link "${lost}")" up
  ps_pod "${lost}" "${elastic[@]}" COHORT_JOIN=1 -- "${program[@]}"
  finish 120
  local out kept=()
  for out in "${started[@]:0:6}"; do [[ "${out}" == "${started[lost - 1]}" ]] || kept+=("${out}"); done
  # The chief's fingerprint: succeeded_with reads the first process's output.
  started=("${chief}" "${kept[@]}" "${started[6]}")
  succeeded_with "${elastic_bits4}" "${started[@]}"
  grep -q "cohort: workers 3 -> 4 at step .*(1 joined)" "${chief}.out" ||
    fail "the chief does not say the job took the worker started again in"
}
case_ps_sync_host_lost_rejoins() { ps_sync_host_lost_rejoins 4; }
case_ps_sync_chief_host_lost_rejoins() { ps_sync_host_lost_rejoins 1; }

# The same job: host 4's worker killed (the job goes on with 3), then its pod started again where
# it reaches the chief's host alone (its routes to the others unreachable). The door takes it in
# at a step boundary, but it cannot form the grown mesh with the others: every process's grow
# fails within the roll call's bound, and the job goes on without it, its servers too. Its pod,
# started again once it reaches every host, is taken in: the bits of a job that lost nobody.
case_ps_sync_newcomer_unreachable() {
  local pid reference h chief
  # Long enough for a failed grow and a take-in (3 times elastic_job's steps, each micro-batch at
  # most every 5 ms: at least 10 s after the loss on any machine).
  local long_job=(--layers "8,512,512,10" --examples 98304 --epochs 2 --quiet)
  reference="$("${mirrored}" --replicas 4 "${long_job[@]}" | awk '$1 == 4 { print $5 }')"
  local program=("${parameter_server}" --consistency sync --micro-batches 8 "${long_job[@]}"
                 --input-ms 5)
  local elastic=(COHORT_MIN_WORKERS=3 COHORT_SECRET=ps-sync-hosts)
  start_ps_hosts "${elastic[@]}" -- "${program[@]}"
  chief="${started[0]}"
  for pid in $(ip netns pids "$(namespace 4)"); do kill -9 "${pid}"; done
  logged "${chief}" "cohort: workers 4 -> 3 at step .*(rank 3 lost: " >/dev/null ||
    fail "the chief does not say the job went on without rank 3"
  for h in 2 3 5 6; do ip -n "$(namespace 4)" route add unreachable "${net}.${h}/32"; done
  ps_pod 4 "${elastic[@]}" COHORT_JOIN=1 -- "${program[@]}"
  logged "${chief}" "cohort: workers 3 -> 3 at step .*(none taken in: " >/dev/null ||
    fail "the chief does not say the job went on without the process it could not take in"
  for pid in $(ip netns pids "$(namespace 4)"); do kill -9 "${pid}"; done
  for h in 2 3 5 6; do ip -n "$(namespace 4)" route del unreachable "${net}.${h}/32"; done
  ps_pod 4 "${elastic[@]}" COHORT_JOIN=1 -- "${program[@]}"
  finish 120
  succeeded_with "${reference}" "${started[@]:0:3}" "${started[@]:4:2}" "${started[7]}"
  grep -q "cohort: workers 3 -> 4 at step .*(1 joined)" "${chief}.out" ||
    fail "the chief does not say the job took the worker started again in"
}

case_no_master() {  # ranks 1 to 3 with no rank 0: each names what it could not reach
  local h
  for h in 2 3 4; do
    on "${h}" COHORT_RANK=$((h - 1)) COHORT_WORLD_SIZE=4 COHORT_MASTER_ADDR=${net}.1 \
      COHORT_MASTER_PORT=29500 COHORT_CONNECT_TIMEOUT=2 -- "${multi_worker}" "${job[@]}"
  done
  finish 30
  local out
  for out in "${started[@]}"; do
    [[ "$(status_of "${out}")" == 2 ]] || fail "$(basename "${out}") exited $(status_of "${out}")"
    grep -q "error: .*${net}.1:29500" "${out}.out" || fail "$(basename "${out}") names no address"
  done
}

case_wrong_secret() {
  local h secret
  for h in 1 2 3 4; do
    secret=right
    [[ "${h}" -eq 4 ]] && secret=wrong
    on "${h}" COHORT_RANK=$((h - 1)) COHORT_WORLD_SIZE=4 COHORT_MASTER_ADDR=${net}.1 \
      COHORT_MASTER_PORT=29500 COHORT_SECRET="${secret}" COHORT_CONNECT_TIMEOUT=5 -- \
      "${multi_worker}" "${job[@]}"
  done
  finish 30
  local out
  for out in "${started[@]}"; do
    [[ "$(status_of "${out}")" != 0 ]] || fail "$(basename "${out}") succeeded with a wrong secret"
    grep -q "error: " "${out}.out" || fail "$(basename "${out}") reports no error"
    grep -q "warning: listening .* without a secret" "${out}.out" &&
      fail "$(basename "${out}") warns about a secret it has"
  done
  grep -qi "secret" "${started[0]}.out" "${started[3]}.out" ||
    fail "neither rank 0 nor rank 3 mentions the secret"
}

for case_name in "${cases[@]}"; do
  started=()
  before="${failures}"
  start="$(date +%s.%N)"
  "case_${case_name}"
  took="$(awk -v a="${start}" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
  if ((failures > before)); then
    show
    echo "FAILED ${case_name} (${took} s)"
  else
    [[ -n "${COHORT_HOSTS_VERBOSE:-}" ]] && show
    echo "ok ${case_name} (${took} s)"
  fi
done
((failures == 0)) || exit 1
