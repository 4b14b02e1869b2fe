#!/usr/bin/env bash
# pslab's push+pull between two hosts, against raw ZeroMQ between the same hosts, in one
# invocation: two network namespaces joined by a veth pair (10.79.0.1 and 10.79.0.2, MTU 1500
# as on an Ethernet link), the worker in one and the server in the other (bench_ps --netns).
# Loopback would skip what a link costs (its 64 KiB MTU, no segmentation); the namespaces are
# removed however the script ends.
#
#   tests/multihost/bench_two_hosts.sh [--build-dir DIR] [bench_ps arguments...]
#
# Default arguments: --sizes-kib 4,4096 --runs 5 --pieces --floor --json runs/bench/ps-two-hosts.json
# (--floor: pslab, the pipelined floor and the raw echo also timed run by run in turn).
# Needs root and iproute2 (ip netns); exits 77 without them.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build="$root/build"
if [[ ${1:-} == --build-dir ]]; then build=$2; shift 2; fi
if [[ ${1:-} == -h || ${1:-} == --help ]]; then sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0; fi
args=("$@")
if ((${#args[@]} == 0)); then
  mkdir -p "$root/runs/bench"
  args=(--sizes-kib 4,4096 --runs 5 --pieces --floor --json "$root/runs/bench/ps-two-hosts.json")
fi
if [[ $(id -u) != 0 ]] || ! command -v ip > /dev/null; then
  echo "bench_two_hosts.sh: skipped: needs root and iproute2 (ip netns)" >&2
  exit 77
fi
a="pslab-bench-a-$$" b="pslab-bench-b-$$"
cleanup() { ip netns del "$a" 2> /dev/null; ip netns del "$b" 2> /dev/null; }
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$a" && ip netns add "$b" &&
  ip link add veth-a$$ netns "$a" type veth peer name veth-b$$ netns "$b" &&
  ip -n "$a" addr add 10.79.0.1/24 dev veth-a$$ && ip -n "$b" addr add 10.79.0.2/24 dev veth-b$$ &&
  ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
  ip -n "$a" link set veth-a$$ up && ip -n "$b" link set veth-b$$ up || { echo "bench_two_hosts.sh: could not make the namespaces" >&2; exit 1; }
"$build/tests/bench_ps" --transport tcp --netns "$a,$b" --server-ip 10.79.0.2 "${args[@]}"
