#!/bin/sh
# /init of the QEMU NUMA guest (busybox sh, PID 1). It loads the modules prepare.sh
# packed, mounts the host's root (9p, read-only) under a tmpfs overlay so the guest can
# write anywhere without touching the host, gives it the guest's own /proc, /sys, /dev,
# a cgroup2-only /sys/fs/cgroup and a tmpfs /run, mounts the writable results
# share at /tmp/pinion-out, runs the test script inside a chroot and powers off.
#
# The script is `pinion.script=PATH` from the kernel command line (a path in the host
# root) or else /tmp/pinion-out/run. Its output goes to the console and to
# /tmp/pinion-out/log; its exit status to /tmp/pinion-out/exit-code. The script itself
# writes /tmp/pinion-out/verdict.
export PATH=/bin
/bin/busybox --install -s /bin

say() { echo "init: $*" >/dev/console 2>/dev/null || echo "init: $*"; }
die() {
  say "FATAL: $*"
  poweroff -f
  sleep 60
}

mount -t proc proc /proc
say "started (uptime $(cut -d' ' -f1 /proc/uptime) s)"
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
ip link set lo up 2>/dev/null
hostname pinion-guest

while read -r m; do
  insmod "/lib/modules/$m" 2>/dev/null || say "insmod $m failed (built in or already loaded?)"
done </lib/modules/order

# msize: 512 KiB messages make reading host binaries over 9p several times faster.
# cache=loose is safe for the read-only host root: nothing changes it during a test.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=loose,ro hostroot /hostroot ||
  die "cannot mount the host root (9p tag hostroot)"

mkdir -p /rw
mount -t tmpfs -o size=1g rw /rw
mkdir -p /rw/upper /rw/work
overlay=1
if ! mount -t overlay overlay -o lowerdir=/hostroot,upperdir=/rw/upper,workdir=/rw/work /newroot; then
  say "overlay over 9p failed; the root stays read-only"
  mount --bind /hostroot /newroot || die "cannot bind the host root"
  overlay=0
fi

r=/newroot
mount -t proc proc $r/proc || die "mount proc"
mount -t sysfs sys $r/sys || die "mount sysfs"
mount -t devtmpfs dev $r/dev || die "mount devtmpfs"
mkdir -p $r/dev/pts $r/dev/shm
# What udev would add: bash's process substitution needs /dev/fd.
ln -sf /proc/self/fd $r/dev/fd
ln -sf /proc/self/fd/0 $r/dev/stdin
ln -sf /proc/self/fd/1 $r/dev/stdout
ln -sf /proc/self/fd/2 $r/dev/stderr
mount -t devpts -o newinstance,ptmxmode=0666 devpts $r/dev/pts
mount -t tmpfs shm $r/dev/shm
mount -t cgroup2 cgroup2 $r/sys/fs/cgroup || die "mount cgroup2"
# What systemd would do on a cgroup v2 host: hand the controllers to child groups.
for c in cpuset cpu io memory pids hugetlb; do
  echo "+$c" >$r/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || say "cannot enable cgroup controller $c"
done
mount -t tmpfs -o mode=755 run $r/run || die "mount /run"
# /tmp stays the overlay's (writable, and a checkout under the host's /tmp stays
# visible) unless the root is read-only.
[ $overlay = 1 ] || mount -t tmpfs -o mode=1777 tmp $r/tmp || die "mount /tmp"
out=$r/tmp/pinion-out
mkdir -p $out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 pinionout $out || die "cannot mount the results share"

script=/tmp/pinion-out/run
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    pinion.script=*) script=${arg#pinion.script=} ;;
  esac
done

say "running $script (uptime $(cut -d' ' -f1 /proc/uptime) s)"
( chroot $r /bin/sh -c "cd / && exec /bin/sh '$script'" </dev/null 2>&1; echo $? >/exit-code ) | tee $out/log
code=$(cat /exit-code 2>/dev/null || echo 255)
echo "$code" >$out/exit-code
say "script exited with $code (uptime $(cut -d' ' -f1 /proc/uptime) s)"
sync
umount $out 2>/dev/null
poweroff -f
sleep 60
