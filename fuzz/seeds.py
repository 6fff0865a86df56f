#!/usr/bin/env python3
"""Seed corpora for the fuzz targets, generated from the repo's own examples and
fixtures into fuzz/seeds/<target>/ (not committed: they follow the repo).

The sysfs seeds use the input format of nodelet/tests/sysfs_input/mod.rs (shared
by fuzz_targets/sysfs.rs and its regression test): a flags byte, then file
contents separated by NUL in the order of its `files()` (\\x01 = absent)."""

import json
import os
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(HERE, "seeds")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def examples():
    d = os.path.join(REPO, "specs/examples")
    return {n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d)) if n.endswith(".yaml")}


POD_JSON = json.dumps({
    "apiVersion": "pinion.io/v1", "kind": "Pod", "metadata": {"name": "a", "labels": {"app": "x"}},
    "spec": {"containers": [{"name": "c", "rootfs": "host", "cpuPolicy": "exclusive",
                             "resources": {"limits": {"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "4Mi"}}}]},
})


def topologies():
    d = os.path.join(REPO, "specs/tests/data")
    out = {n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d)) if n.endswith(".json")}
    out["small.json"] = json.dumps({
        "cpus": [{"id": i, "core": i // 2, "socket": 0, "numa": i // 2} for i in range(4)],
        "numaNodes": [
            {"id": 0, "cpus": [0, 1], "memoryBytes": 1 << 30, "distances": [10, 20],
             "hugepages": [{"pageSizeBytes": 2 << 20, "total": 8}]},
            {"id": 1, "cpus": [2, 3], "memoryBytes": 1 << 30, "distances": [20, 10]},
        ],
        "devices": [{"address": "0000:00:01.0", "class": "0x020000", "numa": 1}],
        "reservedCpus": [0],
    })
    return out


# Must match fuzz_targets/sysfs.rs.
CPU_FILES = ["online", "topology/physical_package_id", "topology/die_id", "topology/core_id",
             "topology/thread_siblings_list", "topology/thread_siblings", "topology/core_siblings_list",
             "topology/core_siblings"]
NODE_FILES = ["cpulist", "cpumap", "meminfo", "distance", "hugepages/hugepages-2048kB/nr_hugepages"]
OTHER_FILES = ["proc/meminfo", "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
               "sys/bus/pci/devices/0000:00:01.0/numa_node", "sys/bus/pci/devices/0000:00:01.0/class"]
FILES = ["sys/devices/system/cpu/online", "sys/devices/system/cpu/present"]
FILES += [f"sys/devices/system/cpu/cpu{c}/{f}" for c in range(4) for f in CPU_FILES]
FILES += [f"sys/devices/system/node/node{n}/{f}" for n in range(2) for f in NODE_FILES]
FILES += OTHER_FILES


def sysfs_seed(root):
    """One input from a captured machine: its first four CPUs and two nodes."""
    flags = 0
    if not os.path.isdir(os.path.join(root, "sys/devices/system/node/node0")):
        flags |= 1
    pci = os.path.join(root, "sys/bus/pci/devices")
    first_pci = sorted(os.listdir(pci))[0] if os.path.isdir(pci) and os.listdir(pci) else None
    if first_pci is None:
        flags |= 2
    if not os.path.isdir(os.path.join(root, "sys/devices/system/cpu/cpu3/topology")):
        flags |= 4
    parts = []
    for f in FILES:
        src = f
        if first_pci and f.startswith("sys/bus/pci/devices/0000:00:01.0/"):
            src = f.replace("0000:00:01.0", first_pci)
        p = os.path.join(root, src)
        try:
            data = open(p, "rb").read().replace(b"\0", b"")
        except OSError:
            data = b"\x01"
        parts.append(data)
    return bytes([flags]) + b"\0".join(parts)


def main():
    ex = examples()
    for n, text in ex.items():
        put("manifest", n, text)
    put("manifest", "pod.json", POD_JSON)
    put("manifest", "list.json", "[" + POD_JSON + "," + POD_JSON.replace('"a"', '"b"') + "]")

    for n, text in topologies().items():
        put("topology_json", n, text)

    for i, s in enumerate(["0-3,8,10-11", "0", "", "0-27,56-83\n", "00000000,0000ffff", "ff", "1,3,5-7",
                           "ffffffff,ffffffff,ffffffff"]):
        put("cpulist", f"s{i}", s)
    for i, s in enumerate(["500m", "2", "1.5", "1Gi", "512Mi", "2M", "1e3", "-2", "0.000000001", "1E-3",
                           "+7Ki", "123456789012345678901234n", ".5", "1Ei"]):
        put("quantity", f"q{i}", s)

    fixtures = os.path.join(REPO, "e2e/fixtures/sysfs")
    for n in sorted(os.listdir(fixtures)):
        if not n.endswith(".tar.gz"):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(os.path.join(fixtures, n)) as t:
                members = [m for m in t.getmembers() if m.isfile() or m.isdir()]
                t.extractall(tmp, members=members)
            seed = sysfs_seed(tmp)
            put("sysfs", n.removesuffix(".tar.gz"), seed)
            # The cpulists of a real machine are cpulist seeds too.
            for f in ("sys/devices/system/cpu/online", "sys/devices/system/node/node0/cpumap",
                      "sys/devices/system/cpu/cpu0/topology/thread_siblings"):
                p = os.path.join(tmp, f)
                if os.path.isfile(p):
                    put("cpulist", n.removesuffix(".tar.gz") + "-" + f.replace("/", "_"), open(p, "rb").read())

    topo = json.loads(topologies()["small.json"])
    node = {"apiVersion": "pinion.io/v1", "kind": "Node", "metadata": {"name": "n1"},
            "spec": {"topology": topo, "endpoint": "127.0.0.1:7443"}}
    report = {"nodeName": "n1", "pods": {"web": {"phase": "Running"}}}
    requests = {
        "create": "POST /api/v1/pods\n\n" + ex.get("pinned.yaml", POD_JSON),
        "create-json": "POST /api/v1/pods\n\n" + POD_JSON,
        "list": "GET /api/v1/pods?labelSelector=app%3Dweb%2Ctier!%3Dx&nodeName=n1\n\n",
        "watch": "GET /api/v1/pods?watch=true&resourceVersion=12\n\n",
        "get": "GET /api/v1/pods/web\n\n",
        "delete": "DELETE /api/v1/pods/web\n\n",
        "log": "GET /api/v1/pods/web/log?container=c&follow=1\n\n",
        "attach": "GET /api/v1/pods/web/attach?container=c&resourceVersion=3&offset=100\n\n",
        "status": "PUT /api/v1/pods/web/status\n\n" + json.dumps({"phase": "Running"}),
        "reject": "POST /api/v1/pods/web/rejection\n\n" + json.dumps({"reason": "NoFit", "message": "m"}),
        "join": "POST /api/v1/join\nBearer abc.def\n" + json.dumps({"nodeName": "n1"}),
        "register": "POST /api/v1/nodes\n\n" + json.dumps(node),
        "nodes": "GET /api/v1/nodes?labelSelector=zone%3Da\n\n",
        "heartbeat": "POST /api/v1/nodes/n1/heartbeat\n\n",
        "report": "PUT /api/v1/nodes/n1/status\n\n" + json.dumps(report),
        "events": "GET /api/v1/events?kind=Node&name=n1\n\n",
        "health": "GET /healthz\n\n",
    }
    # The target's input: request line, caller, Content-Type, Authorization, body.
    for n, r in requests.items():
        first, rest = r.split("\n", 1)
        caller = "anonymous" if n in ("join", "health") else ("node:n1" if n in ("heartbeat", "report", "register") else "admin")
        put("api_request", n, first + "\n" + caller + "\n\n" + rest)
    put("api_request", "create-as-json", "POST /api/v1/pods\nadmin\napplication/json\n\n" + POD_JSON)
    put("api_request", "anonymous-create", "POST /api/v1/pods\nanonymous\n\n\n" + POD_JSON)
    put("api_request", "other-cn-list", "GET /api/v1/pods\ncn:mallory\n\n\n")
    put("api_request", "nested", "POST /api/v1/jobs\nadmin\n\n\n{\"k\": " + "[" * 2000 + "]" * 2000 + "}")

    # Every input a target once failed on stays a seed.
    for kept in ("specs/tests/fuzz-regressions", "nodelet/tests/fuzz-regressions"):
        kept = os.path.join(REPO, kept)
        for target in sorted(os.listdir(kept)) if os.path.isdir(kept) else []:
            for n in sorted(os.listdir(os.path.join(kept, target))):
                put(target, "kept-" + n, open(os.path.join(kept, target, n), "rb").read())


if __name__ == "__main__":
    sys.exit(main())
