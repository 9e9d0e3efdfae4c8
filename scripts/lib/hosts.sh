# shellcheck shell=bash
# shellcheck disable=SC2034 # the HOSTS_ variables are for the scripts that source this file
# Hosts made of network namespaces on a bridge, for tests/hosts and benchmarks/hosts. Sourced,
# never run; needs root and iproute2.
#
#   hosts_create N          hosts 1..N: namespaces ch<tag>-<h>, each with eth0 = ${HOSTS_NET}.<h>/24
#                           on the bridge chb<tag>, and an /etc/hosts of its own (ip netns exec
#                           mounts /etc/netns/<ns>/hosts) naming the others h1..hN, and itself
#                           127.0.1.1 as Debian does. Returns 1 (with HOSTS_PROBLEM) where this
#                           machine cannot make them.
#   hosts_destroy           kills what runs in them and removes them (the caller traps it)
#   hosts_namespace H       host H's namespace
#   hosts_link H            the bridge's side of host H's link: `ip link set ... down` cuts it off
#   hosts_shape RATE        shapes every host's link to RATE (tc's units: 1gbit) by tbf, both ways:
#                           the bridge's side shapes what enters the host, eth0 what leaves it;
#                           returns 1 where tc cannot
#   hosts_unshape           every host's link as it was made again
#   hosts_mpirun_agent DIR  writes DIR/agent, an Open MPI plm_rsh_agent that runs the remote
#                           command in the host whose address it is given (a hostfile lists the
#                           hosts' addresses), with a TMPDIR of its own under DIR and a
#                           directory of its own in /dev/shm for Open MPI's shared memory
#   hosts_bridge_address on|off
#                           gives the bridge ${HOSTS_NET}.254 (mpirun reaches its daemons there)
#
# Unique per process, so that runs side by side do not meet: HOSTS_TAG is $$ and HOSTS_NET is
# 10.77.<HOSTS_TAG % 250>.

HOSTS_TAG="$$"
HOSTS_NET="10.77.$((HOSTS_TAG % 250))"
HOSTS_BRIDGE="chb${HOSTS_TAG}"
HOSTS_MADE=0
HOSTS_PROBLEM=""  # why hosts_create failed, for the caller

hosts_namespace() { echo "ch${HOSTS_TAG}-$1"; }
hosts_link() { echo "chv${HOSTS_TAG}-$1"; }

hosts_create() {
  local count="$1" h other ns
  if [[ "$(id -u)" -ne 0 ]]; then
    HOSTS_PROBLEM="network namespaces need root"
    return 1
  fi
  if ! command -v ip >/dev/null; then
    HOSTS_PROBLEM="no ip (iproute2)"
    return 1
  fi
  if ! ip netns add "$(hosts_namespace 1)" 2>/dev/null; then
    HOSTS_PROBLEM="cannot create a network namespace here"
    return 1
  fi
  HOSTS_MADE="${count}"
  if ! ip link add "${HOSTS_BRIDGE}" type bridge 2>/dev/null; then
    HOSTS_PROBLEM="cannot create a bridge here"
    return 1
  fi
  ip link set "${HOSTS_BRIDGE}" up
  for ((h = 1; h <= count; ++h)); do
    ns="$(hosts_namespace "${h}")"
    ((h == 1)) || ip netns add "${ns}"
    ip link add "$(hosts_link "${h}")" type veth peer name eth0 netns "${ns}"
    ip link set "$(hosts_link "${h}")" master "${HOSTS_BRIDGE}" up
    ip -n "${ns}" addr add "${HOSTS_NET}.${h}/24" dev eth0
    ip -n "${ns}" link set eth0 up
    ip -n "${ns}" link set lo up
    mkdir -p "/etc/netns/${ns}"
    {
      echo "127.0.0.1 localhost"
      for ((other = 1; other <= count; ++other)); do
        if ((other == h)); then
          echo "127.0.1.1 h${other}"
        else
          echo "${HOSTS_NET}.${other} h${other}"
        fi
      done
    } >"/etc/netns/${ns}/hosts"
  done
}

hosts_shape() {
  local rate="$1" h
  for ((h = 1; h <= HOSTS_MADE; ++h)); do
    tc qdisc add dev "$(hosts_link "${h}")" root tbf rate "${rate}" burst 256kb latency 20ms &&
      tc -n "$(hosts_namespace "${h}")" qdisc add dev eth0 root tbf rate "${rate}" burst 256kb \
        latency 20ms || return 1
  done
}

hosts_unshape() {
  local h
  for ((h = 1; h <= HOSTS_MADE; ++h)); do
    tc qdisc del dev "$(hosts_link "${h}")" root
    tc -n "$(hosts_namespace "${h}")" qdisc del dev eth0 root
  done
}

hosts_destroy() {
  local h pids ns
  for ((h = 1; h <= HOSTS_MADE; ++h)); do
    ns="$(hosts_namespace "${h}")"
    pids="$(ip netns pids "${ns}" 2>/dev/null)"
    # shellcheck disable=SC2086 # one pid per word
    [[ -n "${pids}" ]] && kill -9 ${pids} 2>/dev/null
    ip netns del "${ns}" 2>/dev/null
    rm -rf "/etc/netns/${ns}" "/dev/shm/${ns}"
  done
  ip link del "${HOSTS_BRIDGE}" 2>/dev/null
  return 0
}

hosts_mpirun_agent() {
  local directory="$1"
  cat >"${directory}/agent" <<EOF
#!/usr/bin/env bash
# plm_rsh_agent: agent [ssh options] HOST COMMAND...
while [[ "\$1" == -* ]]; do shift; done
host="\$1"
shift
# Every host has its own /tmp on a cluster; here they share one, and Open MPI's session
# directories are named after the host name, which the namespaces share too.
export TMPDIR="${directory}/tmp-\${host}"
mkdir -p "\${TMPDIR}"
# The same for the shared-memory transport's segments (vader), named after the host name too:
# without a directory per host in memory, the ranks of two hosts map each other's and crash.
export OMPI_MCA_btl_vader_backing_directory="/dev/shm/ch${HOSTS_TAG}-\${host##*.}"
mkdir -p "\${OMPI_MCA_btl_vader_backing_directory}"
exec ip netns exec "ch${HOSTS_TAG}-\${host##*.}" /bin/sh -c "\$*"
EOF
  chmod +x "${directory}/agent"
}

hosts_bridge_address() {
  if [[ "$1" == on ]]; then
    ip addr add "${HOSTS_NET}.254/24" dev "${HOSTS_BRIDGE}"
  else
    ip addr del "${HOSTS_NET}.254/24" dev "${HOSTS_BRIDGE}"
  fi
}
