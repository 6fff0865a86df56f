// The web view of the machines: what `pinion topology` draws as text, per node,
// kept current by the server's watches of nodes and pods (no polling). Plain
// script, no build step, nothing loaded from elsewhere; every name from the
// cluster enters the page as text (textContent), never as markup.
"use strict";

// A watch that hears nothing (not even a bookmark, sent every 5 s on an idle
// stream) for this long is dead: it is dropped and resumed.
const SILENCE_MS = 15000;
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 30000;

const state = {
  nodes: new Map(), // name -> Node
  pods: new Map(), // name -> Pod
};

// Follows one watch stream (`GET PATH?watch=true`): applies each change to
// `objects`, resumes from the last version it saw after a drop (with a
// doubling backoff), and lists again (an empty map refilled by the first
// ADDED lines) when that version is too old (410).
class Watch {
  constructor(path, objects, onChange) {
    this.path = path;
    this.objects = objects;
    this.onChange = onChange;
    this.version = null;
    this.backoff = BACKOFF_MIN_MS;
    this.live = false;
  }

  async run() {
    for (;;) {
      try {
        await this.once();
      } catch (e) {
        if (e && e.gone) {
          this.version = null;
          continue;
        }
      }
      this.live = false;
      showConnection();
      await new Promise((r) => setTimeout(r, this.backoff));
      this.backoff = Math.min(this.backoff * 2, BACKOFF_MAX_MS);
    }
  }

  async once() {
    let url = `${this.path}?watch=true&allowWatchBookmarks=true`;
    if (this.version !== null) url += `&resourceVersion=${this.version}`;
    const abort = new AbortController();
    let timer = setTimeout(() => abort.abort(), SILENCE_MS);
    const heard = () => {
      clearTimeout(timer);
      timer = setTimeout(() => abort.abort(), SILENCE_MS);
    };
    try {
      const res = await fetch(url, { signal: abort.signal, cache: "no-store" });
      if (res.status === 410) throw { gone: true };
      if (!res.ok || !res.body) throw new Error(`${this.path}: HTTP ${res.status}`);
      if (this.version === null) {
        // A fresh list: what is not listed again is gone.
        this.objects.clear();
        this.onChange();
      }
      this.live = true;
      this.backoff = BACKOFF_MIN_MS;
      showConnection();
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buffered = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        heard();
        buffered += decoder.decode(value, { stream: true });
        let nl;
        while ((nl = buffered.indexOf("\n")) >= 0) {
          const line = buffered.slice(0, nl).trim();
          buffered = buffered.slice(nl + 1);
          if (line) this.apply(JSON.parse(line));
        }
      }
    } finally {
      clearTimeout(timer);
    }
  }

  apply(event) {
    const obj = event.object || {};
    if (event.type === "ERROR") {
      if (obj.code === 410) throw { gone: true };
      throw new Error(obj.message || "watch error");
    }
    const rv = obj.metadata && obj.metadata.resourceVersion;
    if (typeof rv === "number") this.version = Math.max(this.version || 0, rv);
    if (event.type === "BOOKMARK") return;
    const name = obj.metadata.name;
    if (event.type === "DELETED") this.objects.delete(name);
    else this.objects.set(name, obj);
    this.onChange();
  }
}

// ---- rendering ----

let renderQueued = false;
function queueRender() {
  if (renderQueued) return;
  renderQueued = true;
  setTimeout(() => {
    renderQueued = false;
    render();
  }, 0);
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined) e.textContent = text;
  return e;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n >= 100 || i === 0 ? Math.round(n) : n.toFixed(1)} ${units[i]}`;
}

// A CPU list in the kernel's form (0-3,8).
function cpuList(ids) {
  const s = [...ids].sort((a, b) => a - b);
  const parts = [];
  for (let i = 0; i < s.length; ) {
    let j = i;
    while (j + 1 < s.length && s[j + 1] === s[j] + 1) j++;
    parts.push(i === j ? `${s[i]}` : `${s[i]}-${s[j]}`);
    i = j + 1;
  }
  return parts.join(",") || "none";
}

// Hues for the pods holding CPUs or devices on a node, in order of name,
// spread by the golden angle so that neighbours never look alike.
function hues(pods) {
  const out = new Map();
  [...pods].sort().forEach((p, i) => out.set(p, Math.round((i * 137.508) % 360)));
  return out;
}

function bar(label, free, total, format) {
  const row = el("div", "bar");
  row.append(el("span", "bar-label", label));
  const track = el("span", "bar-track");
  const used = el("span", "bar-used");
  used.style.setProperty("width", `${total > 0 ? ((total - free) / total) * 100 : 0}%`);
  track.append(used);
  row.append(track);
  row.append(el("span", "bar-text", `${format(free)} free of ${format(total)}`));
  return row;
}

function showConnection() {
  const c = document.getElementById("connection");
  const live = watches.every((w) => w.live);
  c.dataset.state = live ? "live" : "reconnecting";
  c.textContent = live ? "live" : "reconnecting";
}

function render() {
  const main = document.getElementById("nodes");
  const nodes = [...state.nodes.values()].sort((a, b) => a.metadata.name.localeCompare(b.metadata.name));
  main.replaceChildren(...(nodes.length ? nodes.map(renderNode) : [el("p", "empty", "no nodes registered yet")]));
  let cpus = 0;
  for (const n of nodes) cpus += n.spec.topology.cpus.length;
  document.getElementById("summary").textContent =
    `${nodes.length} node${nodes.length === 1 ? "" : "s"}, ${cpus} CPUs, ${state.pods.size} pod${state.pods.size === 1 ? "" : "s"}`;
}

function renderNode(node) {
  const name = node.metadata.name;
  const t = node.spec.topology;
  const settings = node.spec.settings || {};
  const status = node.status || {};
  const allocations = (status.allocations && status.allocations.pods) || {};
  const reserved = new Set([...(t.reservedCpus || []), ...(settings.reservedCpus || [])]);
  const offline = new Set(status.offlineCpus || []);

  // CPU -> the pod holding it (exclusive or immovable), device address -> pod,
  // and who runs on the shared pool.
  const holders = new Map();
  const deviceHolders = new Map();
  const onShared = [];
  for (const [pod, placement] of Object.entries(allocations)) {
    for (const c of placement.containers || []) {
      if (c.cpuPolicy === "exclusive" || c.cpuPolicy === "immovable") {
        for (const cpu of c.cpus) holders.set(cpu, { pod, policy: c.cpuPolicy });
      } else {
        onShared.push(`${pod}/${c.name} (${c.cpuPolicy})`);
      }
      for (const addrs of Object.values(c.devices || {})) for (const a of addrs) deviceHolders.set(a, pod);
    }
  }
  const hue = hues(new Set([...[...holders.values()].map((h) => h.pod), ...deviceHolders.values()]));
  const shared = t.cpus
    .map((c) => c.id)
    .filter((id) => !reserved.has(id) && !offline.has(id) && !(holders.has(id) && holders.get(id).policy === "exclusive"));

  const card = el("section", "node");
  card.id = `node-${name}`;
  card.dataset.node = name;
  const head = el("h2");
  head.append(el("span", "node-name", name));
  const condition = el("span", "condition", status.condition || "NotReady");
  condition.dataset.condition = status.condition || "NotReady";
  head.append(condition);
  const sockets = new Set(t.cpus.map((c) => c.socket));
  const cores = new Set(t.cpus.map((c) => c.core));
  head.append(
    el(
      "span",
      "node-facts",
      `${sockets.size} socket${sockets.size === 1 ? "" : "s"}, ${t.numaNodes.length} NUMA node${t.numaNodes.length === 1 ? "" : "s"}, ${cores.size} cores, ${t.cpus.length} CPUs`,
    ),
  );
  card.append(head);

  const pools = el("p", "pools");
  pools.append(el("span", "pool", `shared pool: ${cpuList(shared)} (${shared.length} CPUs)`));
  if (reserved.size) pools.append(el("span", "pool", `reserved: ${cpuList(reserved)}`));
  if (offline.size) pools.append(el("span", "pool", `offline: ${cpuList(offline)}`));
  if (onShared.length) pools.append(el("span", "pool", `on the shared pool: ${onShared.join(", ")}`));
  const nowhere = (t.devices || []).filter((d) => d.numa === null || d.numa === undefined).length;
  if (nowhere) pools.append(el("span", "pool", `PCI devices without a NUMA node: ${nowhere}`));
  card.append(pools);

  const numaStatus = new Map((status.numa || []).map((n) => [n.id, n]));
  const cpuCell = (id) => {
    const cell = el("div", "cpu");
    cell.id = `cpu-${name}-${id}`;
    cell.dataset.node = name;
    cell.dataset.cpu = id;
    cell.append(el("span", "cpu-id", `${id}`));
    const h = holders.get(id);
    if (offline.has(id)) cell.dataset.state = "offline";
    else if (reserved.has(id)) cell.dataset.state = "reserved";
    else if (h) cell.dataset.state = h.policy;
    else cell.dataset.state = "shared";
    if (h) {
      cell.dataset.pod = h.pod;
      cell.style.setProperty("--pod-hue", hue.get(h.pod));
      cell.title = `CPU ${id}: ${h.pod} (${h.policy})`;
      cell.append(el("span", "cpu-pod", h.pod));
    } else {
      cell.title = `CPU ${id}: ${cell.dataset.state}`;
    }
    return cell;
  };

  // socket -> NUMA node -> L3 group -> core -> threads, as the text drawing nests them.
  const layout = new Map();
  const at = (m, k) => {
    if (!m.has(k)) m.set(k, new Map());
    return m.get(k);
  };
  for (const c of t.cpus) {
    const group = c.uncoreCache === undefined || c.uncoreCache === null ? -1 : c.uncoreCache;
    const core = at(at(at(layout, c.socket), c.numa), group);
    if (!core.has(c.core)) core.set(c.core, []);
    core.get(c.core).push(c.id);
  }
  const machine = el("div", "machine");
  const sorted = (m) => [...m.entries()].sort((a, b) => a[0] - b[0]);
  for (const [socket, numas] of sorted(layout)) {
    const s = el("div", "socket");
    s.append(el("h3", null, `socket ${socket}`));
    for (const [numa, groups] of sorted(numas)) {
      const n = numaBox(t, numa, numaStatus.get(numa), deviceHolders, hue);
      for (const [group, coreMap] of sorted(groups)) {
        const g = el("div", "l3");
        if (group >= 0) g.append(el("div", "l3-label", `L3 #${group}`));
        const coresBox = el("div", "cores");
        for (const [core, threads] of sorted(coreMap)) {
          const c = el("div", "core");
          c.append(el("div", "core-label", `core ${core}`));
          const th = el("div", "threads");
          for (const id of threads.sort((a, b) => a - b)) th.append(cpuCell(id));
          c.append(th);
          coresBox.append(c);
        }
        g.append(coresBox);
        n.append(g);
      }
      s.append(n);
    }
    machine.append(s);
  }
  // NUMA nodes without CPUs (memory-only: HBM, CXL) after the sockets.
  const cpuless = t.numaNodes.filter((n) => !n.cpus || n.cpus.length === 0);
  if (cpuless.length) {
    const s = el("div", "socket");
    s.append(el("h3", null, "without CPUs"));
    for (const n of cpuless) s.append(numaBox(t, n.id, numaStatus.get(n.id), deviceHolders, hue));
    machine.append(s);
  }
  card.append(machine);

  const pods = Object.keys(allocations).sort();
  if (pods.length) {
    const legend = el("ul", "pods");
    for (const pod of pods) {
      const li = el("li", "pod");
      li.dataset.pod = pod;
      if (hue.has(pod)) li.style.setProperty("--pod-hue", hue.get(pod));
      else li.classList.add("on-shared");
      const p = state.pods.get(pod);
      const phase = p && p.status ? p.status.phase : "";
      const cpus = [];
      for (const c of allocations[pod].containers || []) {
        if (c.cpuPolicy === "exclusive" || c.cpuPolicy === "immovable") cpus.push(...c.cpus);
      }
      li.append(el("span", "swatch pod-swatch"));
      li.append(el("span", "pod-name", pod));
      li.append(el("span", "pod-facts", `${phase}${cpus.length ? ` CPUs ${cpuList(cpus)}` : " shared pool"}`));
      legend.append(li);
    }
    card.append(legend);
  }
  return card;
}

function numaBox(t, numa, status, deviceHolders, hue) {
  const spec = t.numaNodes.find((n) => n.id === numa) || {};
  const box = el("div", "numa");
  box.dataset.numa = numa;
  const title = el("h4", null, `NUMA node ${numa}${spec.kind === "memory-only" ? " (memory only)" : ""}`);
  box.append(title);
  const total = status ? status.memoryBytes : spec.memoryBytes || 0;
  const free = status ? status.freeMemoryBytes : total;
  box.append(bar("memory", free, total, bytes));
  const pages = status && status.hugepages ? status.hugepages : (spec.hugepages || []).map((h) => ({ pageSizeBytes: h.pageSizeBytes, total: h.total, free: h.total }));
  for (const h of pages) {
    if (h.total > 0) box.append(bar(`huge ${bytes(h.pageSizeBytes)}`, h.free, h.total, (v) => `${v}`));
  }
  const devices = (t.devices || []).filter((d) => d.numa === numa);
  const offered = devices.filter((d) => d.resource);
  if (devices.length) {
    const d = el("div", "devices");
    d.append(el("div", "devices-label", `PCI devices: ${devices.length}${offered.length ? `, offered: ${offered.length}` : ""}`));
    const list = el("ul", "device-list");
    for (const dev of offered) {
      const li = el("li", "device");
      li.dataset.address = dev.address;
      const holder = deviceHolders.get(dev.address);
      if (holder) {
        li.dataset.pod = holder;
        li.style.setProperty("--pod-hue", hue.get(holder));
      }
      li.textContent = `${dev.resource} ${dev.address}${holder ? ` (${holder})` : ""}`;
      list.append(li);
    }
    if (offered.length) d.append(list);
    box.append(d);
  }
  return box;
}

const watches = [
  new Watch("/api/v1/nodes", state.nodes, queueRender),
  new Watch("/api/v1/pods", state.pods, queueRender),
];
for (const w of watches) w.run();
render();
