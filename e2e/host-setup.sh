#!/usr/bin/env bash
# Installs the Debian packages Pinion builds and tests with. Idempotent and quiet
# when everything is already there.
set -euo pipefail
need=()
# hwloc-nox: lstopo-no-graphics, which nodelet/tests/hwloc_lstopo.rs runs on the sysfs fixtures.
# libelf-dev, zlib1g-dev: libbpf (built by libbpf-sys) for the cgroup v2 device filter.
# etcd-server, etcd-client: the store's etcd tests start their own etcd; protobuf-compiler:
# protoc, which the etcd-client crate's build runs.
# openmpi-bin, libopenmpi-dev: the MPI scenario compiles an MPI program and runs
# it with mpirun, its daemons started in a job's members through `pinion rsh`.
# chromium: cli/tests/web.rs loads the web view in headless Chromium.
# containernetworking-plugins (/usr/lib/cni), iptables (the bridge plugin's ipMasq),
# iputils-ping: pod networking through CNI (nodelet/tests/cni.rs, the agent's CNI tests).
# docker-registry, skopeo, apache2-utils (htpasswd): the pull tests start a real
# registry on loopback and push images into it; umoci: the pull benchmark's peer.
for pkg in libseccomp-dev pkg-config numactl faketime python3-venv hwloc-nox libelf-dev zlib1g-dev etcd-server etcd-client protobuf-compiler openmpi-bin libopenmpi-dev chromium containernetworking-plugins iptables iputils-ping docker-registry skopeo apache2-utils umoci; do
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
