#!/bin/bash
# Runs inside the QEMU NUMA guest (two NUMA nodes, cgroup v2 only), started by init.sh
# through /tmp/pinion-out/run, which exports:
#   PINION_BIN  the host-built pinion binary (seen through the read-only host root)
#   NUMA_TOUCH  the allocator prepare.sh built (numa-touch MIB SECONDS [LABEL])
#   PINION_GUEST_SCOPE  `full` (the default) or `kernel`: what depends on the kernel
#               only, for a second kernel whose guest repeats none of the first's
#               checks of the engine (numactl, three exclusive pods, the agent's kill -9)
# It checks the plumbing (NUMA nodes, cgroup v2 controllers, numactl binding), then,
# when the binary has `pinion agent`, the nodelet's four checks of issue 6, its device
# filter, an exec probe kept on the reserved CPUs (issue 29) and the delegated subtree. Results go
# to /tmp/pinion-out: `verdict` (PASS or FAIL), `failures`, `figures` (key value lines),
# `discover.json`, `agent.log`. The host test (e2e/tests/qemu_numa.rs) reads them.
set -u
OUT=/tmp/pinion-out
: >"$OUT/failures"
: >"$OUT/figures"
failures=0
uptime_s() { cut -d' ' -f1 /proc/uptime; }
ok() { echo "ok   - [$(uptime_s)] $*"; }
fail() {
  echo "FAIL - [$(uptime_s)] $*"
  echo "$*" >>"$OUT/failures"
  failures=$((failures + 1))
}
figure() {
  echo "figure: $*"
  echo "$*" >>"$OUT/figures"
}
figure "guest_uptime_at_script_start_s $(uptime_s)"
figure "kernel $(uname -r)"
SCOPE=${PINION_GUEST_SCOPE:-full}
case "$SCOPE" in
  full | kernel) figure "scope $SCOPE" ;;
  *) fail "PINION_GUEST_SCOPE=$SCOPE: expected full or kernel"; SCOPE=full ;;
esac

# The allocator must be reachable from containers whose rootfs is the host's /usr, /bin,
# /lib* and /etc: the guest's root is a writable overlay, so copy it into /usr/local/bin.
install -m 755 "$NUMA_TOUCH" /usr/local/bin/numa-touch || fail "cannot install numa-touch into the guest"
TOUCH=/usr/local/bin/numa-touch
MIB=256

# --- helpers ---------------------------------------------------------------------------

# "0-2,5" -> "0 1 2 5"
expand() {
  local part out=()
  for part in ${1//,/ }; do
    if [[ $part == *-* ]]; then
      out+=($(seq "${part%-*}" "${part#*-}"))
    else
      out+=("$part")
    fi
  done
  echo "${out[@]}"
}
same_set() { [ "$(expand "$1" | tr ' ' '\n' | sort -n | tr '\n' ' ')" = "$(expand "$2" | tr ' ' '\n' | sort -n | tr '\n' ' ')" ]; }
# All CPUs of $1 minus those of $2, as a space-separated list.
minus() {
  local c x keep out=()
  for c in $(expand "$1"); do
    keep=1
    for x in $(expand "$2"); do [ "$c" = "$x" ] && keep=0; done
    [ $keep = 1 ] && out+=("$c")
  done
  echo "${out[@]}" | tr ' ' ','
}

# PIDs of numa-touch processes whose last argument is LABEL (pgrep: a shell loop over
# /proc costs seconds under emulation).
pids_of() { pgrep -f "^(/[^ ]*/)?numa-touch [0-9]+ -?[0-9]+ $1\$"; }
# wait_touched LABEL TIMEOUT [MIB]: waits until exactly one numa-touch LABEL exists and
# has touched its MIB (default $MIB) MiB; prints its PID.
wait_touched() {
  local label=$1 deadline=$(($(date +%s) + ${2:-90})) pages=$((${3:-$MIB} * 256)) pids
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if [ -n "${agent_pid:-}" ] && ! kill -0 "$agent_pid" 2>/dev/null; then
      echo "wait_touched $label: the agent exited" >&2
      return 1
    fi
    pids=$(pids_of "$label")
    if [ -n "$pids" ] && [ "$(echo "$pids" | wc -l)" = 1 ] && [ "$(anon_pages "$pids" | cut -d' ' -f1)" -ge "$pages" ]; then
      echo "$pids"
      return 0
    fi
    sleep 0.5
  done
  echo "wait_touched $label: pids now: $(pids_of "$label" | tr '\n' ' ')" >&2
  [ -n "${agent_pid:-}" ] && "$PINION_BIN" agent status --data-dir "$DATA" >&2
  return 1
}
wait_gone() {
  local deadline=$(($(date +%s) + ${2:-60}))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    [ -z "$(pids_of "$1")" ] && return 0
    sleep 0.5
  done
  return 1
}
# Pages of anonymous mappings (numa_maps lines with anon= and no file=) of PID:
# "TOTAL ON_NODE0 ON_NODE1".
anon_pages() {
  awk '/anon=/ && !/file=/ { for (i = 1; i <= NF; i++) if ($i ~ /^N[0-9]+=/) { split(substr($i, 2), a, "="); n[a[1]] += a[2]; t += a[2] } }
       END { printf "%d %d %d\n", t, n[0], n[1] }' "/proc/$1/numa_maps" 2>/dev/null || echo "0 0 0"
}
# Percentage (one decimal) of PID's anonymous pages on NODE.
share_on() {
  anon_pages "$1" | awk -v node="$2" '{ if ($1 == 0) { print "0.0"; exit } printf "%.1f\n", 100 * $(node + 2) / $1 }'
}
status_field() { sed -n "s/^$2:[[:space:]]*//p" "/proc/$1/status"; }
node_of_cpu() {
  local n
  for n in 0 1; do
    for c in $(expand "$(cat /sys/devices/system/node/node$n/cpulist)"); do [ "$c" = "$1" ] && echo $n && return; done
  done
}
gt95() { awk -v s="$1" 'BEGIN { exit !(s > 95) }'; }

# --- plumbing --------------------------------------------------------------------------

online=$(cat /sys/devices/system/node/online)
[ "$online" = 0-1 ] && ok "NUMA nodes online: $online" || fail "NUMA nodes online: '$online', expected 0-1"
for n in 0 1; do
  echo "node$n cpus $(cat /sys/devices/system/node/node$n/cpulist)"
done
fstype=$(stat -f -c %T /sys/fs/cgroup)
[ "$fstype" = cgroup2fs ] && ok "/sys/fs/cgroup is cgroup2" || fail "/sys/fs/cgroup is $fstype, expected cgroup2fs"
! awk '$3 == "cgroup"' /proc/self/mounts | grep -q . &&
  ok "no cgroup v1 hierarchy mounted" || fail "a cgroup v1 hierarchy is mounted"
for c in cpuset memory; do
  grep -qw "$c" /sys/fs/cgroup/cgroup.controllers && ok "cgroup v2 controller $c available" ||
    fail "cgroup v2 controller $c missing: $(cat /sys/fs/cgroup/cgroup.controllers)"
done

# A binary without these verbs is a failure, never a skip: a clone must test whole.
if ! "$PINION_BIN" discover --help 2>/dev/null | grep -q -- --output; then
  fail "pinion discover has no --output option: is PINION_BIN the binary this tree built?"
elif "$PINION_BIN" discover -o json >"$OUT/discover.json" 2>"$OUT/discover.err"; then
  ok "pinion discover -o json ran (the host test checks its NUMA nodes)"
  figure "discover_phase ran"
else
  fail "pinion discover failed: $(cat "$OUT/discover.err")"
fi

# numactl, the tool HPC people trust: bound to each node, then no binding at all.
if [ "$SCOPE" = full ]; then
  for n in 0 1; do
    numactl --cpunodebind=$n --membind=$n "$TOUCH" $MIB -1 numactl-n$n &
    if pid=$(wait_touched numactl-n$n 60); then
      s=$(share_on "$pid" $n)
      figure "numactl_node${n}_share_pct $s"
      gt95 "$s" && ok "numactl --membind=$n: $s% of anonymous pages on node $n" ||
        fail "numactl --membind=$n: only $s% of anonymous pages on node $n ($(anon_pages "$pid"))"
      kill "$pid"
    else
      fail "numactl --cpunodebind=$n --membind=$n numa-touch never touched its memory"
    fi
    wait
  done
  "$TOUCH" $MIB -1 unbound &
  if pid=$(wait_touched unbound 60); then
    read -r t n0 n1 < <(anon_pages "$pid")
    figure "unbound_node0_share_pct $(awk -v a="$n0" -v t="$t" 'BEGIN { printf "%.1f", 100 * a / t }')"
    figure "unbound_node1_share_pct $(awk -v a="$n1" -v t="$t" 'BEGIN { printf "%.1f", 100 * a / t }')"
    figure "unbound_cpus $(status_field "$pid" Cpus_allowed_list)"
    kill "$pid"
  else
    fail "unbound numa-touch never touched its memory"
  fi
  wait
fi

# --- the nodelet ----------------------------------------------------------------------

MANIFESTS=/var/lib/pinion-qemu/manifests
DATA=/var/lib/pinion-qemu/data
ALL_CPUS=$(cat /sys/devices/system/cpu/online)
RESERVED=0
# The guest sees the host's /etc, where a host's `pinion up` may have written a pod
# network whose bridge this guest's kernel cannot make: the agents here read an empty
# CNI folder instead (pods get a namespace with only lo), which is what is under test.
CNI_NONE=/var/lib/pinion-qemu/cni-none
mkdir -p "$CNI_NONE"
# The agent's command line; CPU 0 reserved, real containers through libcontainer.
agent_args=(agent --manifests "$MANIFESTS" --data-dir "$DATA" --reserved-cpus "$RESERVED" --runtime libcontainer
  --cni-conf-dir "$CNI_NONE")
agent_pid=
start_agent() {
  # A failed probe's words are at debug level (the exec probe's check below shows them).
  PINION_LOG=warn,libcgroups=error,libcontainer=error,nodelet::agent::plan=debug \
    "$PINION_BIN" "${agent_args[@]}" >>"$OUT/agent.log" 2>&1 &
  agent_pid=$!
}
pod() { # NAME KIND(exclusive|shared)
  local name=$1 kind=$2 resources=""
  if [ "$kind" = exclusive ]; then
    resources='
    resources:
      requests: {cpu: "2", memory: 400Mi}
      limits: {cpu: "2", memory: 400Mi}'
    mib=$MIB
  else
    mib=16
  fi
  cat >"$MANIFESTS/$name.yaml.tmp" <<EOF
apiVersion: pinion.io/v1
kind: Pod
metadata:
  name: $name
spec:
  topology:
    policy: single-numa-node
  containers:
  - name: touch
    rootfs: host
    command: [$TOUCH, "$mib", "-1", "$name"]$resources
EOF
  mv "$MANIFESTS/$name.yaml.tmp" "$MANIFESTS/$name.yaml"
}
# Waits until the shared pod's CPUs are exactly EXPECTED (a cpulist).
wait_shared_cpus() {
  local expected=$1 deadline=$(($(date +%s) + 60)) now
  while [ "$(date +%s)" -lt "$deadline" ]; do
    now=$(status_field "$shared_pid" Cpus_allowed_list)
    same_set "$now" "$expected" && return 0
    sleep 0.5
  done
  echo "shared pod CPUs: $(status_field "$shared_pid" Cpus_allowed_list), expected $expected" >&2
  return 1
}
declare -A pod_pid pod_node pod_cpus
# Checks issue 6 (1) for an exclusive pod: two sibling threads of one core of one node,
# Mems_allowed_list that node, >95% of its anonymous pages there. Sets pod_* entries.
check_pinned() {
  local name=$1 pid cpus first siblings node mems s
  if ! pid=$(wait_touched "$name" 60); then
    fail "$name: never ran and touched its memory"
    return 1
  fi
  cpus=$(status_field "$pid" Cpus_allowed_list)
  mems=$(status_field "$pid" Mems_allowed_list)
  first=$(expand "$cpus" | cut -d' ' -f1)
  siblings=$(cat "/sys/devices/system/cpu/cpu$first/topology/thread_siblings_list")
  node=$(node_of_cpu "$first")
  s=$(share_on "$pid" "$node")
  pod_pid[$name]=$pid pod_node[$name]=$node pod_cpus[$name]=$cpus
  figure "pinion_${name}_node $node"
  figure "pinion_${name}_cpus $cpus"
  figure "pinion_${name}_share_pct $s"
  [ "$(expand "$cpus" | wc -w)" = 2 ] && same_set "$cpus" "$siblings" &&
    ok "$name: CPUs $cpus are the two threads of one core (node $node)" ||
    fail "$name: CPUs $cpus are not the sibling pair $siblings"
  [ "$mems" = "$node" ] && ok "$name: Mems_allowed_list $mems" || fail "$name: Mems_allowed_list $mems, expected $node"
  gt95 "$s" && ok "$name: $s% of anonymous pages on node $node" ||
    fail "$name: only $s% of anonymous pages on node $node ($(anon_pages "$pid"))"
}

if ! "$PINION_BIN" agent --help 2>/dev/null | grep -q -- --manifests; then
  fail "pinion agent has no --manifests option: is PINION_BIN the binary this tree built?"
else
  figure "agent_phase ran"
  mkdir -p "$MANIFESTS" "$DATA"
  start_agent
  # (3) a shared pod first: it starts with every CPU and follows the exclusive pods.
  pod shared shared
  if ! shared_pid=$(wait_touched shared 60 16); then
    fail "shared pod never ran"
  else
    wait_shared_cpus "$ALL_CPUS" && ok "shared pod starts on every CPU ($ALL_CPUS)" ||
      fail "shared pod does not start on every CPU"
    # (1) and (2): three 2-CPU single-numa-node pods. With CPU 0 reserved the free full
    # cores are {2,3} on node 0 and {4,5}, {6,7} on node 1: whichever order the engine
    # picks, some pod comes when its predecessor's node has no full core left and must
    # land on the other node; all three fit only if that happens every time.
    exclusive=""
    exclusive_pods="pin-a pin-b pin-c"
    [ "$SCOPE" = full ] || exclusive_pods=pin-a
    for name in $exclusive_pods; do
      pod "$name" exclusive
      check_pinned "$name" || continue
      exclusive=${exclusive:+$exclusive,}${pod_cpus[$name]}
      wait_shared_cpus "$(minus "$ALL_CPUS" "$exclusive")" &&
        ok "shared pod shrank to $(minus "$ALL_CPUS" "$exclusive") after $name" ||
        fail "shared pod did not shrink after $name"
    done
  fi
  if [ -n "${shared_pid:-}" ] && [ "$SCOPE" = full ]; then
    nodes=$(for n in pin-a pin-b pin-c; do echo "$n=node${pod_node[$n]:-?}"; done | tr '\n' ' ')
    figure "pinion_nodes_used $nodes"
    [ "$(for n in pin-a pin-b pin-c; do echo "${pod_node[$n]:-?}"; done | sort -u | tr '\n' ' ')" = "0 1 " ] &&
      ok "exclusive pods spread over both nodes once a node was full ($nodes)" ||
      fail "exclusive pods did not use both nodes: $nodes"
    all_cpus_taken=$(for n in pin-a pin-b pin-c; do expand "${pod_cpus[$n]:-}"; done | tr ' ' '\n' | sort -u | wc -w)
    [ "$all_cpus_taken" = 6 ] && ok "no CPU given to two exclusive pods" || fail "exclusive pods overlap: $all_cpus_taken distinct CPUs"
  fi
  if [ -n "${shared_pid:-}" ]; then
    # (3) continued: a pod goes away, the shared pool grows back.
    rm -f "$MANIFESTS/pin-a.yaml"
    wait_gone pin-a 60 && ok "pin-a stopped when its manifest went away" || fail "pin-a still runs without a manifest"
    exclusive=""
    for name in $exclusive_pods; do
      [ "$name" = pin-a ] || exclusive=${exclusive:+$exclusive,}${pod_cpus[$name]:-}
    done
    wait_shared_cpus "$(minus "$ALL_CPUS" "$exclusive")" &&
      ok "shared pod grew to $(minus "$ALL_CPUS" "$exclusive") after pin-a left" || fail "shared pod did not grow back"
  fi
  if [ -n "${shared_pid:-}" ] && [ "$SCOPE" = full ]; then
    # (4) kill -9 of the agent, restart: the same processes, adopted, pages in place.
    kill -9 "$agent_pid"
    wait "$agent_pid" 2>/dev/null
    echo "--- agent killed with SIGKILL, restarting ---" >>"$OUT/agent.log"
    restarted=$(date +%s)
    start_agent
    # The restarted agent has reconciled once it rewrote its status file.
    for _ in $(seq 60); do
      [ "$(stat -c %Y "$DATA/status.json" 2>/dev/null || echo 0)" -gt "$restarted" ] && break
      sleep 0.5
    done
    sleep 1
    for name in pin-b pin-c shared; do
      now=$(pids_of "$name" | tr '\n' ' ')
      [ "$now" = "${pod_pid[$name]:-$shared_pid} " ] && ok "$name: same process after the agent restart" ||
        fail "$name: processes after restart '$now', before ${pod_pid[$name]:-$shared_pid}"
    done
    for name in pin-b pin-c; do
      s=$(share_on "${pod_pid[$name]}" "${pod_node[$name]}")
      figure "pinion_${name}_share_after_restart_pct $s"
      gt95 "$s" && ok "$name: pages still on node ${pod_node[$name]} ($s%)" || fail "$name: $s% on its node after restart"
    done
    wait_shared_cpus "$(minus "$ALL_CPUS" "$exclusive")" && ok "shared pod CPUs unchanged by the restart" ||
      fail "shared pod CPUs changed by the restart"
    # Adopted, not merely left alone: the new agent stops pin-b and gives its CPUs back.
    rm -f "$MANIFESTS/pin-b.yaml"
    wait_gone pin-b 60 && ok "restarted agent stops the adopted pin-b" || fail "restarted agent did not stop pin-b"
    wait_shared_cpus "$(minus "$ALL_CPUS" "${pod_cpus[pin-c]:-}")" &&
      ok "shared pod grew after the adopted pin-b left" || fail "shared pod did not grow after pin-b left"
  fi
  # The cgroup v2 device filter (libcgroups' cgroupsv2_devices; without it v2 ignores
  # device rules and a container with CAP_MKNOD opens any device, a GPU it was not
  # given included): /dev/kmsg (1:11) is not in the allow list, /dev/null (1:3) is.
  # The node is made in /dev (a tmpfs without nodev): /tmp would refuse both.
  oneshot() { # NAME COMMAND [CAPABILITY]: a pod that runs COMMAND once, on the host's root
    cat >"$MANIFESTS/$1.yaml.tmp" <<EOF
apiVersion: pinion.io/v1
kind: Pod
metadata:
  name: $1
spec:
  restartPolicy: Never
  containers:
  - name: once
    rootfs: host
    command: $2
    securityContext:
      capabilities: {add: [${3:-CHOWN}]}
EOF
    mv "$MANIFESTS/$1.yaml.tmp" "$MANIFESTS/$1.yaml"
  }
  devpod() { # NAME MAJOR:MINOR
    oneshot "$1" "[/bin/sh, -c, \"mknod /dev/probe c ${2%:*} ${2#*:} && exec head -c0 /dev/probe\"]"
  }
  phase_of() { # NAME: the pod's phase in the agent's status file
    python3 -c 'import json,sys
pods = json.load(open(sys.argv[1])).get("pods", {})
print(next((p.get("phase", "") for k, p in pods.items() if k.split("/")[-1] == sys.argv[2]), ""))' "$DATA/status.json" "$1" 2>/dev/null
  }
  wait_phase() { # NAME: waits for Succeeded or Failed, prints it
    local deadline=$(($(date +%s) + 60)) p
    while [ "$(date +%s)" -lt "$deadline" ]; do
      p=$(phase_of "$1")
      case "$p" in Succeeded | Failed) echo "$p"; return 0 ;; esac
      sleep 0.5
    done
    echo "${p:-none}"
  }
  ends() { # NAME PHASE WHAT: the one-shot pod NAME ends in PHASE
    local p
    p=$(wait_phase "$1")
    [ "$p" = "$2" ] && ok "$3" || fail "$3: $1 ended $p, expected $2"
  }
  devpod dev-kmsg 1:11
  devpod dev-null 1:3
  ends dev-kmsg Failed "device filter: a container cannot open a device it was not given (1:11 made with mknod)"
  ends dev-null Succeeded "device filter: the allowed /dev/null (1:3) opens"
  # Real-time scheduling (issue 31): SCHED_FIFO works in a container given SYS_NICE
  # (Debian's kernels have no RT group scheduling, so no budget is needed) and is
  # refused in one without it.
  figure "kernel_realtime $(cat /sys/kernel/realtime 2>/dev/null || echo 0)"
  oneshot rt-nice '[chrt, -f, "10", "true"]' SYS_NICE
  oneshot rt-plain '[chrt, -f, "10", "true"]'
  ends rt-nice Succeeded "real-time: chrt -f 10 runs in a container with SYS_NICE"
  ends rt-plain Failed "real-time: chrt -f is refused without SYS_NICE"
  rm -f "$MANIFESTS/rt-nice.yaml" "$MANIFESTS/rt-plain.yaml"
  # Exec probes off the pod's CPUs (issue 29): on cgroup v2 a probe's command joins the
  # container's namespaces but a cgroup of its own, PARENT/.probes/ID, holding the
  # reserved CPUs, not the pod's cpuset. The probe writes what it sees of itself into
  # the container's /tmp; read here through the container's root.
  cat >"$MANIFESTS/probed.yaml.tmp" <<EOF
apiVersion: pinion.io/v1
kind: Pod
metadata:
  name: probed
spec:
  containers:
  - name: touch
    rootfs: host
    command: [$TOUCH, "16", "-1", "probed"]
    resources:
      requests: {cpu: "2", memory: 100Mi}
      limits: {cpu: "2", memory: 100Mi}
    readinessProbe:
      exec:
        command: [/bin/sh, -c, "cat /proc/self/status /proc/self/cgroup >/tmp/probe-status.tmp && mv /tmp/probe-status.tmp /tmp/probe-status"]
      periodSeconds: 1
      timeoutSeconds: 20
EOF
  mv "$MANIFESTS/probed.yaml.tmp" "$MANIFESTS/probed.yaml"
  probe_dir=
  if ppid=$(wait_touched probed 60 16); then
    pcpus=$(status_field "$ppid" Cpus_allowed_list)
    pcg=$(sed -n 's/^0:://p' "/proc/$ppid/cgroup")
    probe_dir=/sys/fs/cgroup$(dirname "$pcg")/.probes/$(basename "$pcg")
    st=
    for _ in $(seq 240); do
      st=$(cat "/proc/$ppid/root/tmp/probe-status" 2>/dev/null) && [ -n "$st" ] && break
      sleep 0.5
    done
    if [ -z "$st" ]; then
      message=$(python3 -c 'import json,sys
pods = json.load(open(sys.argv[1])).get("pods", {})
print(next((json.dumps({"message": p.get("message"), "conditions": p.get("conditions")}) for k, p in pods.items() if k.split("/")[-1] == "probed"), "no such pod"))' "$DATA/status.json" 2>&1)
      fail "exec probe: it never wrote its status; the pod: $message; $(dirname "$probe_dir"): $(ls -a "$(dirname "$probe_dir")" 2>&1 | tr '\n' ' '); exec.log: $(find "$DATA" -name exec.log -path '*probed*' -exec tail -c 600 {} + 2>&1); probe cgroup: procs $(cat "$probe_dir/cgroup.procs" 2>&1 | tr '\n' ' '), memory.events $(cat "$probe_dir/memory.events" 2>&1 | tr '\n' ' '), pids.events $(cat "$probe_dir/pids.events" 2>&1 | tr '\n' ' '); the agent: $(grep 'probe failed' "$OUT/agent.log" | tail -n 3)"
    else
      probe_cpus=$(echo "$st" | sed -n 's/^Cpus_allowed_list:[[:space:]]*//p')
      probe_cg=$(echo "$st" | sed -n 's/^0:://p')
      figure "exec_probe_cpus $probe_cpus"
      figure "exec_probe_pod_cpus $pcpus"
      same_set "$probe_cpus" "$RESERVED" && ! same_set "$pcpus" "$RESERVED" &&
        ok "exec probe: Cpus_allowed_list $probe_cpus, the reserved CPUs (its pod runs on $pcpus)" ||
        fail "exec probe: Cpus_allowed_list '$probe_cpus', expected the reserved $RESERVED (its pod runs on $pcpus)"
      case "$probe_cg" in
        */.probes/*) ok "exec probe: in its probe cgroup ($probe_cg from the container's cgroup namespace)" ;;
        *) fail "exec probe: its cgroup is '$probe_cg', expected under .probes/" ;;
      esac
      [ "$(cat "$probe_dir/cpuset.cpus" 2>&1)" = "$RESERVED" ] && [ "$(cat "$probe_dir/pids.max" 2>&1)" = 64 ] &&
        [ "$(cat "$probe_dir/memory.max" 2>&1)" = $((128 << 20)) ] &&
        ok "exec probe: $probe_dir holds the reserved CPUs and its own memory and pids bounds" ||
        fail "exec probe: $probe_dir: cpuset.cpus '$(cat "$probe_dir/cpuset.cpus" 2>&1)', pids.max '$(cat "$probe_dir/pids.max" 2>&1)', memory.max '$(cat "$probe_dir/memory.max" 2>&1)'"
    fi
  else
    fail "exec probe: the probed pod never ran"
  fi
  rm -f "$MANIFESTS/probed.yaml"
  wait_gone probed 60 || fail "probed still runs after its manifest was removed"
  if [ -n "$probe_dir" ]; then
    for _ in $(seq 20); do [ ! -d "$probe_dir" ] && break; sleep 0.5; done
    [ ! -d "$probe_dir" ] && ok "exec probe: its cgroup went with its container" || fail "exec probe: $probe_dir left behind"
  fi
  # spec.tuning on cgroup v2 (issue 31): a pod with every setting this guest has (no
  # cpufreq under QEMU), the files read from outside while it runs, and every one of
  # them equal to before once it is gone.
  tuned_files() { # every file the tuner may write, with its value
    for f in /sys/devices/system/cpu/cpu*/power/pm_qos_resume_latency_us /proc/irq/default_smp_affinity \
      /proc/irq/*/smp_affinity; do
      echo "$f $(cat "$f" 2>&1)"
    done
  }
  allows() { # MASK CPU: whether a kernel hex mask has the CPU's bit
    local m=${1//,/}
    (((0x$m >> $2) & 1))
  }
  message_of() { # NAME: the pod's status message
    python3 -c 'import json,sys
pods = json.load(open(sys.argv[1])).get("pods", {})
print(next((p.get("message") or "" for k, p in pods.items() if k.split("/")[-1] == sys.argv[2]), ""))' "$DATA/status.json" "$1" 2>/dev/null
  }
  tuned_before=$(tuned_files)
  cat >"$MANIFESTS/tuned.yaml.tmp" <<EOF
apiVersion: pinion.io/v1
kind: Pod
metadata:
  name: tuned
spec:
  tuning: {irqLoadBalancing: disabled, cpuQuota: disabled, cpuLoadBalancing: disabled, cpuCStates: disabled}
  containers:
  - name: touch
    rootfs: host
    command: [$TOUCH, "16", "-1", "tuned"]
    resources:
      requests: {cpu: "2", memory: 100Mi}
      limits: {cpu: "2", memory: 100Mi}
EOF
  mv "$MANIFESTS/tuned.yaml.tmp" "$MANIFESTS/tuned.yaml"
  if tpid=$(wait_touched tuned 60 16); then
    tcpus=$(status_field "$tpid" Cpus_allowed_list)
    tcg=/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$tpid/cgroup")
    first=$(expand "$tcpus" | cut -d' ' -f1)
    # The tuner runs once the container runs: give it a moment under emulation.
    for _ in $(seq 40); do
      [ "$(cat "/sys/devices/system/cpu/cpu$first/power/pm_qos_resume_latency_us")" = n/a ] && break
      sleep 0.5
    done
    sleep 1
    tmsg=$(message_of tuned)
    figure "tuned_cpus $tcpus"
    bad=
    for c in $(expand "$tcpus"); do
      v=$(cat "/sys/devices/system/cpu/cpu$c/power/pm_qos_resume_latency_us")
      [ "$v" = n/a ] || bad="$bad cpu$c=$v"
    done
    [ -z "$bad" ] && ok "tuned: pm_qos_resume_latency_us n/a on its CPUs $tcpus (no C-state)" ||
      fail "tuned: pm_qos_resume_latency_us:$bad (the pod: $tmsg)"
    quota=$(cat "$tcg/cpu.max" 2>&1)
    [ "${quota%% *}" = max ] && ok "tuned: cpu.max '$quota' (no CFS quota) in $tcg" ||
      fail "tuned: cpu.max '$quota' in $tcg, expected max (the pod: $tmsg)"
    dflt=$(cat /proc/irq/default_smp_affinity)
    bad=
    for c in $(expand "$tcpus"); do allows "$dflt" "$c" && bad="$bad $c"; done
    [ -z "$bad" ] && ok "tuned: /proc/irq/default_smp_affinity $dflt leaves out CPUs $tcpus" ||
      fail "tuned: /proc/irq/default_smp_affinity $dflt still allows$bad"
    # Each interrupt either leaves the pod's CPUs or is named in its status (the kernel
    # refused it, or it allows only the pod's CPUs).
    moved=0 named=0 unexplained=
    for f in /proc/irq/[0-9]*/smp_affinity; do
      irq=$(basename "$(dirname "$f")") m=$(cat "$f") hit=
      for c in $(expand "$tcpus"); do allows "$m" "$c" && hit=1; done
      if [ -z "$hit" ]; then
        moved=$((moved + 1))
      elif echo "$tmsg" | grep -q "interrupt $irq[: ]"; then
        named=$((named + 1))
      else
        unexplained="$unexplained $irq($m)"
      fi
    done
    figure "tuned_irqs_clear $moved"
    figure "tuned_irqs_reported $named"
    [ -z "$unexplained" ] && ok "tuned: $moved interrupts leave CPUs $tcpus, $named kept them and are named in the status" ||
      fail "tuned: interrupts still on CPUs $tcpus and not reported:$unexplained (the pod: $tmsg)"
    part=$(cat "$tcg/cpuset.cpus.partition" 2>&1)
    figure "tuned_partition $part"
    if [ "$part" = isolated ]; then
      ok "tuned: $tcg is an isolated cpuset partition (no load balancing)"
      # Linux 6.7 and later: a remote partition, its CPUs declared exclusive on
      # /pinion, and the kernel's own list of isolated CPUs holds them.
      if [ -e /sys/fs/cgroup/cpuset.cpus.isolated ]; then
        iso=$(cat /sys/fs/cgroup/cpuset.cpus.isolated)
        figure "tuned_kernel_isolated $iso"
        figure "tuned_pinion_exclusive $(cat /sys/fs/cgroup/pinion/cpuset.cpus.exclusive)"
        [ "$(expand "$iso")" = "$(expand "$tcpus")" ] && ok "tuned: the kernel lists CPUs $iso as isolated" ||
          fail "tuned: cpuset.cpus.isolated '$iso', expected the pod's $tcpus"
      fi
    elif echo "$tmsg" | grep -q "cannot make an isolated partition"; then
      ok "tuned: no isolated partition here ($part), and the pod's status says so"
    else
      fail "tuned: cpuset.cpus.partition '$part' and the status does not say why: $tmsg"
    fi
  else
    fail "tuned: the pod never ran (the agent: $(tail -c 400 "$OUT/agent.log"))"
  fi
  rm -f "$MANIFESTS/tuned.yaml"
  wait_gone tuned 60 || fail "tuned still runs after its manifest was removed"
  for _ in $(seq 40); do [ "$(tuned_files)" = "$tuned_before" ] && break; sleep 0.5; done
  tuned_after=$(tuned_files)
  [ "$tuned_after" = "$tuned_before" ] && ok "tuned: every tuned file is as before once the pod is gone" ||
    fail "tuned: files differ after the pod: $(diff <(echo "$tuned_before") <(echo "$tuned_after") | grep '^[<>]' | head -5 | tr '\n' ' ')"
  if [ -e /sys/fs/cgroup/pinion/cpuset.cpus.exclusive ]; then
    left=$(cat /sys/fs/cgroup/pinion/cpuset.cpus.exclusive)
    [ -z "$left" ] && ok "tuned: /pinion declares no exclusive CPU once the pod is gone" ||
      fail "tuned: /pinion still declares exclusive CPUs '$left' after the pod"
  fi
  # Cleanup: every pod away, no container left behind.
  rm -f "$MANIFESTS"/*.yaml
  for name in pin-a pin-b pin-c shared dev-kmsg dev-null rt-nice rt-plain probed tuned; do
    wait_gone "$name" 60 || fail "$name still runs after its manifest was removed (leak)"
  done
  kill "$agent_pid" 2>/dev/null
  wait "$agent_pid" 2>/dev/null
  # The containers' parent goes when the agent stops with no pod left, with the
  # .probes folder the exec probe's cgroup was made in.
  if [ -e /sys/fs/cgroup/pinion ]; then
    fail "the stopped agent left /sys/fs/cgroup/pinion: $(find /sys/fs/cgroup/pinion -mindepth 1 -type d | tr '\n' ' ')"
  else
    ok "no /sys/fs/cgroup/pinion (nor its .probes) once the pods are gone and the agent stopped"
  fi
fi

# --- the agent in a delegated subtree (systemd's Delegate=yes, cgroup v2) ---------------
# What systemd does for pinion-agent.service: the unit's cgroup under system.slice, some
# controllers handed down, the trusted.delegate mark, the agent started inside it. The
# agent must keep everything inside: itself in supervisor/, containers in pods/, and no
# write outside (system.slice deliberately lacks io and hugetlb, which libcgroups would
# enable there if it created a container's cgroup path from the root down).
if "$PINION_BIN" agent --help 2>/dev/null | grep -q -- --manifests; then
  figure "delegated_phase ran"
  SLICE=/sys/fs/cgroup/system.slice
  UNIT=$SLICE/pinion-agent.service
  DMAN=/var/lib/pinion-qemu/delegated-manifests
  DDATA=/var/lib/pinion-qemu/delegated-data
  mkdir -p "$UNIT" "$DMAN" "$DDATA"
  for c in cpuset cpu memory pids; do echo "+$c" >"$SLICE/cgroup.subtree_control"; done
  python3 -c 'import os,sys; os.setxattr(sys.argv[1], "trusted.delegate", b"1")' "$UNIT" ||
    fail "cannot set trusted.delegate on $UNIT"
  # Every cgroup outside the unit's, with what it hands down.
  outside() {
    find /sys/fs/cgroup -path "$UNIT" -prune -o -type d -print | sort | while read -r d; do
      echo "$d: $(cat "$d/cgroup.subtree_control")"
    done
  }
  outside >"$OUT/outside-before"
  (
    echo $BASHPID >"$UNIT/cgroup.procs"
    exec "$PINION_BIN" agent --manifests "$DMAN" --data-dir "$DDATA" --reserved-cpus 0 --runtime libcontainer \
      --cni-conf-dir "$CNI_NONE"
  ) >>"$OUT/agent-delegated.log" 2>&1 &
  dpid=$!
  cat >"$DMAN/deleg.yaml.tmp" <<EOF
apiVersion: pinion.io/v1
kind: Pod
metadata:
  name: deleg
spec:
  containers:
  - name: touch
    rootfs: host
    command: [$TOUCH, "16", "-1", "deleg"]
    resources:
      requests: {cpu: "2", memory: 100Mi}
      limits: {cpu: "2", memory: 100Mi}
EOF
  mv "$DMAN/deleg.yaml.tmp" "$DMAN/deleg.yaml"
  if pid=$(agent_pid=$dpid wait_touched deleg 60 16); then
    own=$(sed -n 's/^0:://p' "/proc/$dpid/cgroup")
    [ "$own" = /system.slice/pinion-agent.service/supervisor ] && ok "delegated: the agent moved itself into supervisor/" ||
      fail "delegated: the agent's cgroup is $own, expected /system.slice/pinion-agent.service/supervisor"
    cg=$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
    case "$cg" in
      /system.slice/pinion-agent.service/pods/*) ok "delegated: the container's cgroup is $cg" ;;
      *) fail "delegated: the container's cgroup is $cg, expected under /system.slice/pinion-agent.service/pods/" ;;
    esac
    cpus=$(status_field "$pid" Cpus_allowed_list)
    eff=$(cat "/sys/fs/cgroup$cg/cpuset.cpus.effective" 2>/dev/null)
    [ "$(expand "$cpus" | wc -w)" = 2 ] && same_set "$cpus" "$eff" &&
      ok "delegated: the container holds CPUs $cpus through its own cpuset" ||
      fail "delegated: CPUs $cpus, cgroup cpuset.cpus.effective '$eff'"
    [ "$(cat "/sys/fs/cgroup$cg/memory.max" 2>&1)" = $((100 << 20)) ] &&
      ok "delegated: the memory limit is in the container's cgroup" ||
      fail "delegated: memory.max of the container's cgroup is '$(cat "/sys/fs/cgroup$cg/memory.max" 2>&1)'"
  else
    fail "delegated: the pod never ran (agent log: $(tail -c 600 "$OUT/agent-delegated.log"))"
  fi
  rm -f "$DMAN/deleg.yaml"
  wait_gone deleg 60 && ok "delegated: the pod stopped when its manifest went away" || fail "delegated: the pod still runs"
  for _ in $(seq 20); do [ -z "$(ls -d "$UNIT"/pods/*/ 2>/dev/null)" ] && break; sleep 0.5; done
  [ -z "$(ls -d "$UNIT"/pods/*/ 2>/dev/null)" ] && ok "delegated: no container cgroup left in pods/" ||
    fail "delegated: cgroups left: $(ls -d "$UNIT"/pods/*/)"
  outside >"$OUT/outside-after"
  if cmp -s "$OUT/outside-before" "$OUT/outside-after"; then
    ok "delegated: no cgroup outside the unit's was created or given controllers"
  else
    fail "delegated: the agent changed cgroups outside its subtree: $(diff "$OUT/outside-before" "$OUT/outside-after" | tr '\n' ' ')"
  fi
  kill "$dpid" 2>/dev/null
  wait "$dpid" 2>/dev/null
fi

figure "guest_uptime_at_verdict_s $(uptime_s)"
if [ "$failures" -eq 0 ]; then
  echo PASS >"$OUT/verdict"
else
  echo "FAIL ($failures)" >"$OUT/verdict"
fi
cat "$OUT/verdict"
