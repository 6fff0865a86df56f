#!/usr/bin/env bash
# Installs the Debian packages Pinion builds and tests with. Idempotent and quiet
# when everything is already there.
#
#   host-setup.sh          what the build, `pinion up` and the whole test suite need
#   host-setup.sh --run    only what the build and `pinion up` need (the README's
#                          first command): 33.5 MB of downloads against about 385 MB on a
#                          minimal Debian 12 (no browser, MPI, etcd or registry)
set -euo pipefail
# libseccomp-dev, pkg-config: libcontainer's seccomp; libelf-dev, zlib1g-dev: libbpf
# (built by libbpf-sys) for the cgroup v2 device filter; containernetworking-plugins
# (/usr/lib/cni) and iptables (the bridge plugin's ipMasq): the default pod network.
run_pkgs=(libseccomp-dev pkg-config libelf-dev zlib1g-dev containernetworking-plugins iptables)
case "${1:-}" in
  --run) test_pkgs=() ;;
  "") test_pkgs=(numactl faketime python3-venv hwloc-nox etcd-server etcd-client openmpi-bin libopenmpi-dev chromium iputils-ping docker-registry skopeo apache2-utils umoci) ;;
  *) echo "host-setup: unknown argument ${1}: use --run, or nothing for everything the tests need" >&2; exit 2 ;;
esac
need=()
# The tests' own:
# hwloc-nox: lstopo-no-graphics, which nodelet/tests/hwloc_lstopo.rs runs on the sysfs fixtures.
# etcd-server, etcd-client: the store's etcd tests start their own etcd.
# openmpi-bin, libopenmpi-dev: the MPI scenario compiles an MPI program and runs
# it with mpirun, its daemons started in a job's members through `pinion rsh`.
# chromium: cli/tests/web.rs loads the web view in headless Chromium.
# iputils-ping: pod networking through CNI (nodelet/tests/cni.rs, the agent's CNI tests).
# docker-registry, skopeo, apache2-utils (htpasswd): the pull tests start a real
# registry on loopback and push images into it; umoci: the pull benchmark's peer.
for pkg in "${run_pkgs[@]}" "${test_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "host-setup: missing packages ${need[*]}; run as root or: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
