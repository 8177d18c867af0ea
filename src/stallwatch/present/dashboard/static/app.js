// The dashboard page: renders the JSON documents of /api (computed by stallwatch's analysis layer). Every
// value from a run is put in the page as text (textContent), never as HTML. No external resources.
"use strict";

const state = { run: null, tab: "overview", version: -1, node: null, zoom: null, overview: null, source: null };
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}
const colored = (e, color) => { e.style.color = color; return e; };  // CSSOM, allowed by the page's CSP
const fmt = (v, d = 1) => (v == null || Number.isNaN(v) ? "–" : Number(v).toFixed(d));
const when = (us) => (us ? new Date(us / 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–");
const evidence = (e) => (Array.isArray(e) ? e.join("\n") : Object.entries(e || {}).map(([k, v]) => `${k}: ${typeof v === "object" ? JSON.stringify(v) : v}`).join("\n"));
function human(v, unit) {
  if (v == null || Number.isNaN(v)) return "–";
  if (unit !== "B" && unit !== "B/s") return fmt(v);
  const units = ["", "K", "M", "G", "T"]; let i = 0; let x = Math.abs(v);
  while (x >= 1000 && i < units.length - 1) { x /= 1000; i++; }
  return `${(Math.sign(v) * x).toFixed(i ? 1 : 0)} ${units[i]}${unit}`;
}
function dur(s) {
  if (s == null) return "–";
  if (s < 60) return `${s.toFixed(1)} s`;
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : `${m}m ${Math.round(s % 60)}s`;
}

async function get(path) {
  const r = await fetch(path, { credentials: "same-origin" });
  const doc = await r.json();
  if (!r.ok) throw new Error(doc.error || r.statusText);
  return doc;
}

function table(node, headers, rows) {
  node.replaceChildren(el("tr", {}, ...headers.map((h) => el("th", {}, h))),
    ...rows.map((r) => { const tr = el("tr", r.attrs || {}); for (const c of r.cells || r) tr.append(c instanceof Node ? el("td", {}, c) : el("td", typeof c === "number" ? { class: "num" } : {}, c)); return tr; }));
}

// -- Overview ------------------------------------------------------------------------------------------
function renderOverview(doc) {
  state.overview = doc;
  const f = doc.findings || {};
  const exit = doc.exit || {};
  const steps = Object.entries(doc.steps || {}).map(([m, n]) => `${m} ${n}`).join(", ") || "none";
  const ranks = new Set((doc.step_stats || []).map((r) => `${r.node}/${r.rank}`)).size;
  const cards = [["Status", exit.state || "running"], ["Exit code", exit.code == null ? "–" : exit.code],
    ["Start", when(doc.start_us)], ["Duration", dur(doc.duration_s)], ["Nodes", (doc.nodes || []).length],
    ["Ranks", ranks], ["Steps", steps],
    ["Sampling", Object.values(doc.sample_interval_ms || {}).map((v) => `${v} ms`).join(", ") || "–"]];
  document.getElementById("summary").replaceChildren(...cards.map(([k, v]) => el("div", { class: "card" }, k, el("b", {}, v))));
  document.getElementById("verdict").textContent = f.verdict || "";
  document.getElementById("findings").replaceChildren(...(f.findings || []).map((x) =>
    el("li", { onclick: () => openFinding(x), title: "open the Nodes view where it was seen" },
      el("span", { class: `sev-${x.severity}` }, `[${x.severity}] `), x.title,
      el("div", {}, `where: ${[...(x.where.nodes || []), ...(x.where.ranks || [])].join(", ") || "the whole run"}`),
      el("div", {}, `try: ${x.recommendation}`),
      el("details", {}, el("summary", {}, "evidence"), el("pre", {}, evidence(x.evidence))))));
  document.getElementById("notes").replaceChildren(...(doc.notes || []).map((n) => el("li", {}, n)));
  const usage = [];
  for (const [node, stats] of Object.entries(doc.usage || {}))
    for (const u of stats) usage.push([node, u.label, human(u.mean, u.unit), human(u.p50, u.unit), human(u.p95, u.unit), human(u.max, u.unit)]);
  table(document.getElementById("usage"), ["node", "metric", "mean", "p50", "p95", "max"], usage);
  table(document.getElementById("rules"), ["rule", "status", "triggered", "datapoints", "description / recommendation"],
    (doc.rules || []).map((r) => ({ attrs: r.RuleTriggered > 0 ? { class: "fired" } : {}, cells: [r.RuleName,
      r.Status, r.RuleTriggered, r.Datapoints,
      el("details", {}, el("summary", {}, r.Description || ""), el("p", {}, r.Recommendation || ""),
        el("p", {}, r.Message || ""), el("pre", {}, JSON.stringify(r.Details || {}, null, 1)))] })));
  const ops = [];
  for (const [dev, rows] of Object.entries(doc.operators || {}))
    for (const o of rows.slice(0, 10)) ops.push([dev, o.name ?? o.operator ?? "", fmt(o.percent ?? o.pct, 1), JSON.stringify(o)]);
  table(document.getElementById("operators"), ["device", "operator", "% of time", "numbers"], ops);
  document.getElementById("run-name").textContent = doc.run_id || "";
}

function openFinding(x) {
  const nodes = (x.where && x.where.nodes) || [];
  const windows = (x.where && x.where.windows) || [];
  state.node = nodes[0] || (state.overview && state.overview.nodes[0]) || null;
  state.zoom = windows.length ? [windows[0][0], windows[windows.length - 1][1]] : null;
  show("nodes");
}

// -- Nodes ---------------------------------------------------------------------------------------------
function lineChart(panel, spans, zoom) {
  const W = 1000, H = 150, P = 4;
  const all = panel.series.flatMap((s) => s.ts);
  if (!all.length) return el("div", {}, "no data");
  let [t0, t1] = zoom || [Math.min(...all), Math.max(...all)];
  if (t1 <= t0) t1 = t0 + 1;
  let ymax = panel.percent ? 100 : 0;
  if (!panel.percent) for (const s of panel.series) for (const v of s.values) if (v != null && v > ymax) ymax = v;
  ymax = ymax || 1;
  const x = (t) => P + ((t - t0) / (t1 - t0)) * (W - 2 * P), y = (v) => H - P - (v / ymax) * (H - 2 * P);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  for (const sp of spans) {
    if (sp.end_us < t0 || sp.start_us > t1) continue;
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", x(Math.max(sp.start_us, t0))); r.setAttribute("y", 0);
    r.setAttribute("width", Math.max(1, x(Math.min(sp.end_us, t1)) - x(Math.max(sp.start_us, t0)))); r.setAttribute("height", H);
    r.setAttribute("fill", sp.flagged ? "rgba(217,83,79,0.15)" : "rgba(79,163,224,0.08)");
    const t = document.createElementNS(ns, "title"); t.textContent = `${sp.label} ${sp.text || ""}`; r.append(t);
    svg.append(r);
  }
  panel.series.forEach((s, i) => {
    let d = "", pen = false;
    s.ts.forEach((t, k) => {
      const v = s.values[k];
      if (v == null || t < t0 || t > t1) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`; pen = true;
    });
    const p = document.createElementNS(ns, "path");
    p.setAttribute("d", d); p.setAttribute("fill", "none");
    p.setAttribute("stroke", COLORS[i % COLORS.length]); p.setAttribute("stroke-width", "1.5");
    p.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(p);
  });
  // Brush to zoom: drag across a chart; every chart follows (one time axis).
  let from = null;
  svg.addEventListener("mousedown", (e) => { from = e.offsetX / svg.clientWidth; });
  svg.addEventListener("mouseup", (e) => {
    if (from == null) return; const to = e.offsetX / svg.clientWidth;
    if (Math.abs(to - from) > 0.01) { const a = Math.min(from, to), b = Math.max(from, to); state.zoom = [t0 + a * (t1 - t0), t0 + b * (t1 - t0)]; loadNodes(); }
    from = null;
  });
  return svg;
}

function axis(panel, zoom) {
  const all = panel.series.flatMap((s) => s.ts);
  if (!all.length) return el("div");
  const [t0, t1] = zoom || [Math.min(...all), Math.max(...all)];
  return el("div", { class: "axis" }, el("span", {}, when(t0)), el("span", {}, dur((t1 - t0) / 1e6)), el("span", {}, when(t1)));
}

async function loadNodes() {
  const ov = state.overview || (await loadOverview());
  const pick = document.getElementById("node-pick");
  if (!pick.options.length || pick.options.length !== ov.nodes.length)
    pick.replaceChildren(...ov.nodes.map((n) => el("option", { value: n }, n)));
  state.node = state.node && ov.nodes.includes(state.node) ? state.node : ov.nodes[0];
  if (!state.node) { document.getElementById("panels").replaceChildren(el("p", {}, "no node has reported yet")); return; }
  pick.value = state.node;
  const range = state.zoom ? `?from=${Math.floor(state.zoom[0])}&to=${Math.ceil(state.zoom[1])}` : "";  // a zoom reads that range at full resolution
  const doc = await get(`/api/runs/${encodeURIComponent(state.run)}/nodes/${encodeURIComponent(state.node)}${range}`);
  const spans = [...doc.phases, ...doc.flagged.map((s) => ({ ...s, flagged: true }))];
  const last = (ov.node_status[state.node] || {}).last_us;
  const badge = document.getElementById("node-badge");
  const ago = last ? Math.max(0, (Date.now() * 1000 - last) / 1e6) : null;
  badge.textContent = ago == null ? "no sample yet" : `last sample ${ago < 120 ? ago.toFixed(0) + " s" : dur(ago)} ago`;
  badge.className = "badge" + (ago != null && ago > 10 && ov.exit.state === "running" ? " stale" : "");
  document.getElementById("panels").replaceChildren(...doc.panels.map((p) => el("div", { class: "panel" },
    el("div", {}, el("b", {}, p.title), ` (${p.y_label})`),
    lineChart(p, spans, state.zoom),
    axis(p, state.zoom),
    el("div", { class: "legend" }, ...p.series.map((s, i) => colored(el("span", {}, `— ${s.name}`), COLORS[i % COLORS.length]))))));
}

// -- Ranks ---------------------------------------------------------------------------------------------
function heat(node, matrix, rows, label) {
  if (!matrix || !matrix.length) { node.replaceChildren(el("p", {}, "no steps recorded")); return; }
  const L = 110, cols = matrix[0].length, cell = Math.max(2, Math.min(12, Math.floor(900 / cols)));
  const c = el("canvas", { width: L + cols * cell, height: rows.length * 14 });
  const g = c.getContext("2d");
  g.font = "11px sans-serif"; g.fillStyle = "#1d232a";
  rows.forEach((r, i) => g.fillText(r, 2, i * 14 + 11));
  g.translate(L, 0);
  let max = 0; for (const r of matrix) for (const v of r) if (v != null && v > max) max = v;
  matrix.forEach((r, i) => r.forEach((v, j) => {
    if (v == null) return; const k = max ? v / max : 0;
    g.fillStyle = `rgb(${Math.round(255 * k)},${Math.round(80 + 100 * (1 - k))},${Math.round(200 * (1 - k))})`;
    g.fillRect(j * cell, i * 14, cell, 13);
  }));
  node.replaceChildren(el("div", {}, `${label}: max ${fmt(max, 1)} (darker red is higher); columns are buckets of consecutive steps`), c);
}

async function loadRanks() {
  const doc = await get(`/api/runs/${encodeURIComponent(state.run)}/ranks`);
  const s = doc.straggler;
  document.getElementById("straggler").textContent = s ? `Straggler: ${s.Status}, triggered ${s.RuleTriggered}. ${s.Message || ""}` : "";
  heat(document.getElementById("heat-step"), doc.step_ms, doc.ranks || [], `step time (ms), ${doc.mode} steps from ${doc.first_step}, ${doc.steps_per_column} per column`);
  heat(document.getElementById("heat-wait"), doc.wait_pct, doc.ranks || [], "data wait");
}

// -- Runs ----------------------------------------------------------------------------------------------
async function loadRuns() {
  const doc = await get("/api/runs");
  table(document.getElementById("run-list"), ["run", "status", "start", "duration", "nodes", "top finding"],
    doc.runs.map((r) => [el("a", { href: `#${encodeURIComponent(r.id)}`, onclick: () => { setRun(r.id); show("overview"); } }, r.id),
      r.status, when(r.start_us), dur(r.duration_s), (r.nodes || []).join(", "), r.top_finding || r.verdict || ""]));
  return doc;
}

// -- wiring --------------------------------------------------------------------------------------------
async function loadOverview() {
  const doc = await get(`/api/runs/${encodeURIComponent(state.run)}/overview`);
  renderOverview(doc);
  return doc;
}

async function refresh() {
  if (!state.run && state.tab !== "runs") return;
  try {
    if (state.tab === "overview") await loadOverview();
    else if (state.tab === "nodes") { await loadOverview(); await loadNodes(); }
    else if (state.tab === "ranks") await loadRanks();
    else await loadRuns();
  } catch (e) { console.error(e); }
}

function show(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("on", b.dataset.tab === tab);
  for (const s of document.querySelectorAll(".tab")) s.classList.toggle("on", s.id === tab);
  refresh();
}

function follow() {
  if (state.source) state.source.close();
  state.source = null;
  const live = document.getElementById("live");
  if (!state.run || document.hidden) { live.className = "off"; return; }
  const src = new EventSource(`/api/runs/${encodeURIComponent(state.run)}/events`);
  src.onmessage = (m) => { const d = JSON.parse(m.data); if (d.version !== state.version) { state.version = d.version; refresh(); } };
  src.onopen = () => { live.className = "on"; };
  src.onerror = () => { live.className = "off"; };
  state.source = src;
}

function setRun(id) {
  state.run = id; state.version = -1; state.overview = null; state.node = null; state.zoom = null;
  document.getElementById("download").setAttribute("href", `/api/runs/${encodeURIComponent(id)}/report.html`);
  history.replaceState(null, "", `#${encodeURIComponent(id)}`);
  follow();
}

document.addEventListener("DOMContentLoaded", async () => {
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.tab));
  document.getElementById("node-pick").addEventListener("change", (e) => { state.node = e.target.value; loadNodes(); });
  document.getElementById("zoom-reset").addEventListener("click", () => { state.zoom = null; loadNodes(); });
  document.addEventListener("visibilitychange", follow);  // no stream, no updates in a hidden tab
  document.getElementById("controls").addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = {};
    for (const [k, v] of new FormData(e.target).entries()) if (v) body[k] = v;
    const out = document.getElementById("control-result");
    const r = await fetch(`/api/runs/${encodeURIComponent(state.run)}/config`, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-Stallwatch": "1" }, body: JSON.stringify(body) });
    const doc = await r.json();
    out.className = r.ok ? "" : "error";
    out.textContent = r.ok ? `asked at ${when(doc.asked_us)}: ${JSON.stringify(doc.changed)}; the job picks it up at its next step` : doc.error;
  });
  const runs = await loadRuns();
  const wanted = decodeURIComponent(location.hash.slice(1));
  const first = runs.runs.find((r) => r.id === wanted) || runs.runs[0];
  if (first) { setRun(first.id); show("overview"); } else show("runs");
});
