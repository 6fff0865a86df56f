#!/usr/bin/env bash
# Boots the QEMU NUMA guest once: e2e/qemu/boot.sh OUT_DIR [KERNEL_ARGS...]
# OUT_DIR is shared writable with the guest (mounted there at /tmp/pinion-out); the guest
# runs OUT_DIR/run (or pinion.script=PATH from KERNEL_ARGS), writes log, exit-code and
# verdict into it and powers off. The serial console goes to stdout. Needs the variables
# prepare.sh prints (it runs it when QEMU_KERNEL is unset).
#
# Guest: 2 sockets x 2 cores x 2 threads, NUMA node 0 = CPUs 0-3, node 1 = CPUs 4-7,
# 2 GiB each, cgroup v2 only. Software emulation (TCG): the paravirtual /dev/kvm of the
# build machines cannot boot a stock kernel, and CI may have no KVM at all.
# Skylake-Client keeps the SMT siblings that `-cpu max` loses under TCG.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -ge 1 ] || { echo "usage: boot.sh OUT_DIR [KERNEL_ARGS...]" >&2; exit 2; }
out=$(cd "$1" && pwd)
shift
if [ -z "${QEMU_KERNEL:-}" ]; then
  eval "$("$here/prepare.sh")"
fi
# Features TCG cannot emulate, switched off so that QEMU does not warn once per vCPU.
cpu=Skylake-Client,pcid=off,x2apic=off,tsc-deadline=off,hle=off,invpcid=off,rtm=off,rdseed=off,3dnowprefetch=off,xsavec=off
exec qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu "$cpu" -machine q35 \
  -smp 8,sockets=2,cores=2,threads=2 -m 4G \
  -object memory-backend-ram,id=m0,size=2G -object memory-backend-ram,id=m1,size=2G \
  -numa node,nodeid=0,cpus=0-3,memdev=m0 -numa node,nodeid=1,cpus=4-7,memdev=m1 \
  -kernel "$QEMU_KERNEL" -initrd "$QEMU_INITRD" \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 $*" \
  -nographic -no-reboot -nodefaults -serial stdio -monitor none \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$out,mount_tag=pinionout,security_model=none"
