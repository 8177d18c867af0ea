// stallwatch dashboard: Overview, Nodes, Ranks and Runs from the JSON API; live updates from one event stream
// per tab (closed while the tab is hidden). Everything read from a run is untrusted: it reaches the page only
// through textContent and attributes, never as HTML.
"use strict";

const $ = id => document.getElementById(id);
const state = { runs: null, run: null, view: "overview", node: null, from: null, to: null, summary: null,
                cores: new Set(), gpus: new Set(), source: null, lastSample: {}, recent: {}, clockSkew: 0,
                timeline: null, refreshTimer: null, changedAt: 0, fetchedAt: 0 };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(e.dataset, v); else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  return e;
}

async function api(path, opts) {
  const r = await fetch(path, Object.assign({ credentials: "same-origin" }, opts || {}));
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
  return body;
}
const runApi = (what, params) => api(`/api/run/${encodeURIComponent(state.run)}/${what}` + (params ? "?" + new URLSearchParams(params) : ""));

function fmtUs(us) { return us ? new Date(us / 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") : "–"; }
const fmtDur = s => Cat.duration(s);  // as the report and the terminal say durations
function num(v, d = 1) { return v === null || v === undefined ? "–" : Number(v).toFixed(d); }
// A nested object (a finding's evidence, a rule's details) as a table of names and formatted values (the unit
// from each name's suffix, catalogue.js), never raw JSON; at most `limit` rows.
function kvTable(obj, limit = 200) {
  const t = el("table", { class: "data kv-data" });
  let rows = 0;
  const walk = (prefix, v, depth) => {
    if (rows >= limit) return;
    if (v !== null && typeof v === "object" && !Array.isArray(v) && depth < 4) {
      for (const [k, x] of Object.entries(v)) walk(prefix ? `${prefix} › ${k}` : k, x, depth + 1);
      return;
    }
    const key = prefix.split(" › ").pop();
    let text;
    if (Array.isArray(v)) {
      const shown = v.slice(0, 8).map(x => x !== null && typeof x === "object" ? Object.entries(x).map(([a, b]) => `${a} ${Cat.value(a, b)}`).join(", ") : Cat.value(key, x));
      text = shown.join("; ") + (v.length > 8 ? ` … (${v.length} in all)` : "");
    } else text = Cat.value(key, v);
    t.appendChild(el("tr", {}, el("td", { class: "text" }, prefix), el("td", { class: "text" }, text)));
    rows++;
  };
  walk("", obj, 0);
  if (rows >= limit) t.appendChild(el("tr", {}, el("td", { class: "muted" }, `first ${limit} values shown`)));
  return t;
}
function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

// -- routing -----------------------------------------------------------------------------------------------
function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  state.view = p.get("view") || state.view;
  if (p.get("run")) state.run = p.get("run");
  state.node = p.get("node") || state.node;
  state.from = p.get("from") ? Number(p.get("from")) : null;
  state.to = p.get("to") ? Number(p.get("to")) : null;
}
function writeHash() {
  const p = new URLSearchParams();
  if (state.run) p.set("run", state.run);
  p.set("view", state.view);
  if (state.view === "nodes" && state.node) p.set("node", state.node);
  if (state.view === "nodes" && state.from !== null) { p.set("from", String(Math.round(state.from))); p.set("to", String(Math.round(state.to))); }
  history.replaceState(null, "", "#" + p.toString());
}
// An address typed, pasted or followed (back/forward, a link): the page follows it. The page's own changes of the
// address use replaceState, which fires no hashchange.
function onHashChange() {
  const before = state.run;
  readHash();
  if (state.run !== before) {
    state.summary = null; state.node = null; state.timeline = null; state.recent = {}; state.lastSample = {};
    $("download").href = `/api/run/${encodeURIComponent(state.run)}/report`;
    connectLive();
  }
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.get("run") && !p.get("view")) state.view = "overview";
  show(state.run ? state.view : "runs");
}

function show(view) {
  state.view = view;
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === "view-" + view);
  writeHash();
  render().catch(showError);
}

async function render() {
  showError(null);
  if (state.view === "runs" || !state.run) return renderRuns();
  if (state.view === "overview") return renderOverview();
  if (state.view === "nodes") return renderNodes();
  if (state.view === "ranks") return renderRanks();
  if (state.view === "stacks") return renderStacks();
}

// -- runs ----------------------------------------------------------------------------------------------------
async function renderRuns() {
  if (state.view !== "runs") { for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === "view-runs"); }
  const doc = await api("/api/runs");
  state.runs = doc;
  const t = $("runs-table"); t.textContent = "";
  t.appendChild(el("tr", {}, ...["Run", "Status", "Start", "Duration", "Nodes", "Severity", "Top finding"].map(h => el("th", h === "Duration" ? {} : { class: "text" }, h))));
  for (const r of doc.runs) {
    const running = r.status === "running" && r.start_us;
    const sev = ["high", "medium", "low"].includes(r.top_severity) ? r.top_severity : null;
    t.appendChild(el("tr", { class: "clickable", dataset: { run: r.id }, onclick: () => openRun(r.id) },
      el("td", {}, r.run_id && r.run_id !== r.id ? `${r.id} (id ${r.run_id})` : r.id), el("td", { class: "text" }, r.status + (r.exit_code ? ` (${r.exit_code})` : "")),
      el("td", { class: "text" }, fmtUs(r.start_us)),
      el("td", running ? { class: "live-duration", dataset: { start: String(r.start_us) } } : {}, running ? fmtDur(runningFor(r.start_us)) : fmtDur(r.duration_s)),
      el("td", { class: "text" }, r.nodes.join(", ")),
      el("td", { class: "text" }, sev ? el("span", { class: "severity " + sev }, sev) : ""),
      el("td", { class: "text wrap" }, r.top_finding || (r.verdict ? "–" : "– (rules not evaluated yet)"))));
  }
  if (!doc.runs.length) t.appendChild(el("tr", {}, el("td", {}, "No runs here yet.")));
  fillCompare(doc.runs);
}

// -- two runs compared (stallwatch compare's content) -----------------------------------------------------------
function fillCompare(runs) {
  $("compare-card").hidden = runs.length < 2;
  for (const [id, pick] of [["compare-baseline", 1], ["compare-run", 0]]) {
    const s = $(id), keep = s.value;
    s.textContent = "";
    for (const r of runs) s.appendChild(el("option", { value: r.id }, r.id));
    s.value = runs.some(r => r.id === keep) ? keep : (runs[Math.min(pick, runs.length - 1)] || {}).id || "";
  }
}

async function submitCompare(ev) {
  ev.preventDefault();
  $("compare-error").textContent = "";
  const base = $("compare-baseline").value, run = $("compare-run").value;
  if (base === run) { $("compare-error").textContent = "Pick two different runs."; return; }
  try {
    const c = await api(`/api/run/${encodeURIComponent(run)}/compare?` + new URLSearchParams({ baseline: base }));
    drawCompare(c);
  } catch (e) { $("compare-error").textContent = String(e.message || e); }
}

// A change as the compare command prints it: one decimal, signed ("+7.6 %", "0.0 %").
function changeText(pct) {
  if (pct === null || pct === undefined || !Number.isFinite(pct)) return "–";
  const text = pct.toFixed(1);
  return text === "0.0" || text === "-0.0" ? "0.0 %" : `${pct > 0 ? "+" : ""}${text} %`;
}

function pairTable(head, pairs, label) {
  const t = el("table", { class: "data" }, el("tr", {}, ...[head, "baseline", "run", "change"].map((h, i) => el("th", i ? {} : { class: "text" }, h))));
  for (const p of pairs) t.appendChild(el("tr", {}, el("td", { class: "text" }, label(p.name)), el("td", {}, Cat.number(p.baseline)), el("td", {}, Cat.number(p.run)), el("td", {}, changeText(p.change_pct))));
  return t;
}

function drawCompare(c) {
  const box = $("compare"); box.textContent = "";
  const pct = c.p50_change_pct;
  box.appendChild(el("p", { id: "compare-verdict" }, pct === null || pct === undefined
    ? `${c.run_id} and ${c.baseline_id} have no TRAIN steps to compare.`
    : `The median TRAIN step of ${c.run_id} is ${Cat.number(Math.abs(pct))} % ${pct > 0 ? "slower" : "faster"} than ${c.baseline_id}'s.`));
  for (const n of c.notes || []) box.appendChild(el("p", { class: "muted" }, n));
  const steps = [];
  for (const [mode, t] of Object.entries(c.step_times || {})) {
    const keys = Object.keys((t.baseline || t.run || {})).filter(k => k !== "steps");
    steps.push({ name: `${mode} steps`, baseline: t.baseline && t.baseline.steps, run: t.run && t.run.steps, change_pct: null });
    for (const k of keys) {
      const b = t.baseline ? t.baseline[k] : null, r = t.run ? t.run[k] : null;
      steps.push({ name: `${mode} ${k.replace(/_ms$/, "")} (ms)`, baseline: b, run: r, change_pct: b && r !== null && r !== undefined ? 100 * (r - b) / b : null });
    }
  }
  const wrap = el("div", { class: "scroll compare-tables" });
  if (steps.length) wrap.appendChild(pairTable("step time", steps, n => n));
  for (const [mode, pairs] of Object.entries(c.phases || {})) if (pairs.length) wrap.appendChild(pairTable(`${mode} phase (% of step)`, pairs, n => Cat.label(n)));
  if ((c.utilization || []).length) wrap.appendChild(pairTable("utilization (mean %)", c.utilization, n => n));
  if ((c.operators_us_per_step || []).length) wrap.appendChild(pairTable("operator (µs per profiled step)", c.operators_us_per_step, n => n));
  box.appendChild(wrap);
  const f = c.findings || {}, items = [];
  for (const [word, list] of [["appeared", f.appeared], ["went away", f.gone], ["in both", f.kept]]) for (const x of list || []) items.push(el("li", {}, el("b", {}, word + ": "), x));
  box.appendChild(el("h3", {}, "Findings"));
  box.appendChild(items.length ? el("ul", { id: "compare-findings" }, ...items) : el("p", { class: "muted" }, "No finding in either run."));
}

// "1 violation", "2 violations".
function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

// How long a running job has run, by the server's clock (the page's, corrected by the live stream's skew).
function runningFor(startUs) { return Math.max(0, (Date.now() * 1000 + state.clockSkew - startUs) / 1e6); }
function tickRuns() {
  for (const td of document.querySelectorAll("#runs-table td.live-duration")) td.textContent = fmtDur(runningFor(Number(td.dataset.start)));
}

function openRun(id) {
  state.run = id; state.node = null; state.from = state.to = null; state.summary = null; state.captureCount = undefined;
  state.recent = {}; state.lastSample = {};
  $("download").href = `/api/run/${encodeURIComponent(id)}/report`;
  connectLive();
  show("overview");
}

// -- overview ------------------------------------------------------------------------------------------------
async function renderOverview() {
  const summary = await runApi("summary");
  state.summary = summary; state.fetchedAt = Date.now();
  renderHeader(summary);
  renderSummary(summary);
  loadFindings();
  runApi("usage").then(renderUsage).catch(showError);
  runApi("operators").then(renderOperators).catch(showError);
  runApi("functions").then(renderFunctions).catch(showError);
  runApi("profiling").then(renderProfiling).catch(showError);
}

// The findings follow the charts: a run whose rules were never stored has them evaluated on the server (minutes
// on a long multi-node run); until then the page says how far that got and asks again.
function loadFindings() {
  clearTimeout(state.findingsTimer);
  const run = state.run;
  runApi("findings").then(f => {
    if (run !== state.run) return;
    renderFindings(f);
    const note = $("findings-progress");
    if (f.pending) {
      const p = f.pending, part = p.total ? ` — ${Math.min(p.done, p.total)} of ${p.total} slices` : "";
      note.textContent = `${p.stale ? "Updating" : "Evaluating"} the rules${part} (${p.elapsed_s.toFixed(0)} s so far)…`;
      if (state.view === "overview") state.findingsTimer = setTimeout(loadFindings, 1000);
    } else note.textContent = f.error || "";
  }).catch(showError);
}

function renderHeader(s) {
  $("run-name").textContent = s.run_id;
  const b = $("run-status"); b.textContent = s.fate.state + (s.fate.code ? ` (exit ${s.fate.code})` : "");
  b.className = "badge " + s.fate.state;
}

function renderSummary(s) {
  const t = $("summary-table"); t.textContent = "";
  const steps = Object.entries(s.steps).map(([m, n]) => `${m} ${n.toLocaleString()}`).join(" · ") || "none yet";
  const intervals = [...new Set(s.nodes.map(n => n.sample_interval_ms))].map(v => `${v} ms`).join(", ");
  const rows = [["Status", s.fate.state + (s.fate.code !== null && s.fate.code !== undefined ? `, exit code ${s.fate.code}` : "") + (s.fate.signal ? `, ${s.fate.signal}` : "")],
    ["Command", s.command.join(" ")], ["Start", fmtUs(s.start_us)], ["Duration", fmtDur(s.duration_s)],
    ["Nodes", `${s.nodes.length} (${s.nodes.map(n => n.name).join(", ")})`],
    ["Ranks", String(s.nodes.reduce((a, n) => a + n.ranks.length, 0))],
    ["Steps", steps], ["Training loop", fmtDur(s.training_loop_s)], ["Sampling interval", intervals]];
  for (const [k, v] of rows) t.appendChild(el("tr", {}, el("td", {}, k), el("td", { id: k === "Steps" ? "steps-cell" : "summary-" + k.toLowerCase().replace(/\W+/g, "-") }, v)));
  $("steps-cell").dataset.total = String(s.total_steps);
  $("summary-duration").dataset.seconds = String(s.duration_s);
  $("summary-ranks").dataset.ranks = String(s.nodes.reduce((a, n) => a + n.ranks.length, 0));
  const parts = s.parts_s ? Object.entries(s.parts_s).map(([label, value]) => ({ label, value })) : [];
  renderJobDetails(s);
  Plots.draw("phase-pie", { kind: "pie", title: null, size: 150, unit: "s", na: "no steps recorded yet",
    slices: parts.filter(p => p.value > 0).sort((a, b) => b.value - a.value) })
    .then(() => { $("phase-pie").dataset.colours = JSON.stringify(Plots.series("phase-pie")); });
  Plots.draw("progress-chart", Plots.timeSpec({ title: "steps done (all ranks)", height: 130,
    lines: [{ name: "steps", color: Cat.colour("TRAIN"), ts: s.progress.t, values: s.progress.steps }] }));
  for (const n of s.notes || []) t.appendChild(el("tr", {}, el("td", {}, "Note"), el("td", {}, n)));
}

// Initialization, the training loop and finalization: each part's time and share of the job, as the server's
// run document states them (`parts_s`, brought up to date while the job runs).
function swatch(colour) { const e = el("span", { class: "swatch" }); e.style.background = colour; return e; }  // CSSOM: the CSP allows no style attributes
function renderJobDetails(s) {
  const t = $("job-details"); t.textContent = "";
  const parts = Object.entries(s.parts_s || {});
  if (!parts.length) { t.appendChild(el("tr", {}, el("td", { class: "muted text" }, "No step recorded yet: the job's parts are known from its first step."))); return; }
  const total = parts.reduce((a, [, v]) => a + (v || 0), 0);
  t.appendChild(el("tr", {}, ...["Part", "Duration", "Share of the job"].map(h => el("th", {}, h))));
  for (const [name, v] of parts) {
    t.appendChild(el("tr", { dataset: { part: name } }, el("td", { class: "text" }, swatch(Cat.colour(name) || "#999"), name),
      el("td", {}, fmtDur(v)), el("td", {}, total > 0 ? Cat.fmt(100 * v / total, "%") : "–")));
  }
  t.appendChild(el("tr", {}, el("td", { class: "text" }, "Whole job"), el("td", {}, fmtDur(total)), el("td", {}, Cat.fmt(100, "%"))));
}

// A running job's duration goes on between the summaries the live stream sends (each at least a second apart).
function tickDuration() {
  const s = state.summary, cell = $("summary-duration");
  if (!s || !cell || s.fate.state !== "running" || !s.start_us || state.view !== "overview") return;
  const seconds = Math.max(s.duration_s, (Date.now() * 1000 + state.clockSkew - s.start_us) / 1e6);
  cell.textContent = fmtDur(seconds); cell.dataset.seconds = String(seconds);
}

// The live stream's summary: the stored figures brought up to date with the job's live counts (server side).
function onSummary(s) {
  if (s.id !== undefined && state.run !== null && s.id !== state.run) return;
  state.summary = s; state.fetchedAt = Date.now();
  renderHeader(s);
  if (state.view === "overview") renderSummary(s);
  else if (state.view === "nodes") renderBadges();
}

function renderFindings(f) {
  $("verdict").textContent = f.verdict || "";
  const box = $("findings"); box.textContent = "";
  for (const x of f.findings) {
    const where = [x.where.nodes.length ? "nodes " + x.where.nodes.join(", ") : null, x.where.ranks.length ? "ranks " + x.where.ranks.join(", ") : null].filter(Boolean).join(" · ");
    const card = el("div", { class: "finding " + x.severity, dataset: { rule: x.rule } },
      el("div", { class: "title" }, x.title),
      el("div", { class: "muted" }, `${x.rule} · ${x.severity}` + (x.time_at_stake_s ? ` · ${fmtDur(x.time_at_stake_s)} at stake` : "") + (where ? ` · ${where}` : "")),
      el("div", {}, x.recommendation),
      el("details", {}, el("summary", {}, "evidence"), kvTable(x.evidence)));
    if (x.where.windows && x.where.windows.length) {
      card.appendChild(el("button", { class: "show-on-nodes", onclick: () => showWindows(x) }, `Show on Nodes (${x.where.windows.length} window${x.where.windows.length > 1 ? "s" : ""})`));
    }
    box.appendChild(card);
  }
  if (!f.findings.length && !(f.pending && !f.pending.stale)) box.appendChild(el("p", { class: "muted" }, "No findings."));
  const rules = $("rules"); rules.textContent = "";
  for (const r of f.rules) {
    const label = r.triggered ? "fired" : (r.status === "not_applicable" || r.status === "no_data" ? "not applicable" : r.status || "ok");
    rules.appendChild(el("details", { dataset: { rule: r.name } },
      el("summary", {}, el("span", { class: "rule-state " + (r.triggered ? "fired" : label === "ok" ? "ok" : "") }, label), r.name,
        el("span", { class: "muted" }, ` — ${plural(r.violations ?? 0, "violation")} of ${plural(r.datapoints ?? 0, "datapoint")}`)),
      el("p", {}, r.description || ""), el("p", {}, el("b", {}, "Recommendation: "), r.recommendation || ""),
      r.message ? el("p", { class: "muted" }, r.message) : null,
      el("p", {}, el("b", {}, "Criteria: "), Object.entries(r.parameters).map(([k, v]) => `${k}=${Cat.value(k, v)}`).join(", ")),
      kvTable(r.details)));
  }
}

function showWindows(finding) {
  const w = finding.where.windows;
  const lo = Math.min(...w.map(x => x[0])), hi = Math.max(...w.map(x => x[1]));
  const pad = Math.max((hi - lo) * 0.1, 5e6);
  state.from = lo - pad; state.to = hi + pad;
  state.node = finding.where.nodes[0] || state.node;
  state.flagged = w;
  show("nodes");
}

function renderUsage(u) {
  const t = $("usage-table"); t.textContent = "";
  t.appendChild(el("tr", {}, ...["Node", "Metric", "mean", "p50", "p95", "max"].map(h => el("th", {}, h))));
  for (const [node, stats] of Object.entries(u.nodes)) for (const s of stats) {
    const f = v => Cat.fmt(v, s.unit);
    t.appendChild(el("tr", {}, el("td", {}, node), el("td", { class: "text" }, s.label), el("td", {}, f(s.mean)), el("td", {}, f(s.p50)), el("td", {}, f(s.p95)), el("td", {}, f(s.max))));
  }
  t.appendChild(el("caption", { class: "muted" }, `mean and max of every snapshot; p50 and p95 of ${u.percentiles_of}`));
  for (const s of u.all) t.appendChild(el("tr", {}, el("td", {}, "all nodes"), el("td", { class: "text" }, s.label), el("td", {}, Cat.fmt(s.mean, "%")), el("td", {}, "–"), el("td", {}, "–"), el("td", {}, Cat.fmt(s.max, "%"))));
}

function renderOperators(o) {
  const box = $("operators"); box.textContent = "";
  if (!o.operators.length) { box.appendChild(el("p", { class: "muted" }, o.windows ? "The detailed windows recorded no operators." : "No detailed-profiling window yet: request one below.")); return; }
  const t = el("table", { class: "data" }, el("tr", {}, el("th", {}, "Operator [device]"), el("th", {}, "self time per step (ms)")));
  for (const x of o.operators) t.appendChild(el("tr", {}, el("td", {}, x.name), el("td", {}, Cat.number(x.self_us_per_step / 1000))));
  box.appendChild(t);
}

// A function's file as its last two parts (the whole path on hover); cProfile writes "~" for built-ins.
function whereCell(file, line) {
  if (!file || file === "~") return el("td", { class: "text muted" }, "built-in");
  return el("td", { class: "text wrap", title: `${file}:${line}` }, `${file.split("/").slice(-2).join("/")}:${line}`);
}

// Each Python-profiling window's top functions by own time (the summary stored with it, as the report lists them).
function renderFunctions(f) {
  const box = $("functions"); box.textContent = "";
  if (!f.windows.length) { box.appendChild(el("p", { class: "muted" }, "No Python-profiling window yet: request one below.")); return; }
  for (const w of f.windows) {
    const steps = w.first_step === null ? "" : `, steps ${w.first_step}–${w.last_step ?? "…"}`;
    box.appendChild(el("h3", {}, `${w.node}/${w.rank} · ${w.profiler}${steps}`));
    if (w.error || !w.functions.length) { box.appendChild(el("p", { class: "muted" }, w.error || "No function summary was stored with this window.")); continue; }
    const t = el("table", { class: "data functions", dataset: { window: w.window } },
      el("tr", {}, ...["Function", "Where", "Calls", "Own (ms)", "Cumulative (ms)"].map((h, i) => el("th", i < 2 ? { class: "text" } : {}, h))));
    for (const x of w.functions) t.appendChild(el("tr", {}, el("td", { class: "text wrap" }, x.function), whereCell(x.file, x.line),
      el("td", {}, Cat.number(x.calls)), el("td", {}, Cat.number(x.self_us / 1000)), el("td", {}, Cat.number(x.total_us / 1000))));
    box.appendChild(t);
    if (w.total > w.functions.length) box.appendChild(el("p", { class: "muted" }, `the top ${w.functions.length} of ${w.total} functions`));
  }
}

const fmtInterval = v => v >= 1000 ? `${v / 1000} s` : `${v} ms`;
function openRange(node, start, end) {
  const pad = Math.max(((end || start) - start) * 0.5, 2e6);
  state.node = node; state.from = start - pad; state.to = (end || start) + pad; state.flagged = [[start, end || start]];
  show("nodes");
}
function captureLinks(c) {
  const links = (c.stored || []).map(f => el("a", { class: "capture-file", download: "", href: `/api/run/${encodeURIComponent(state.run)}/capture?` +
    new URLSearchParams({ node: c.node, rank: String(c.rank), window: c.window, file: f }) }, f));
  links.push(el("a", { class: "capture-timeline", href: "#", onclick: ev => { ev.preventDefault(); openRange(c.node, c.start_us, c.end_us); } }, "timeline"));
  return el("span", { class: "capture", dataset: { window: c.window } }, `${c.node}/${c.rank} `, ...links.flatMap(a => [a, " "]));
}
function renderProfiling(p) {
  $("interval").textContent = fmtInterval(p.sample_interval_ms);
  const pick = $("interval-pick");
  if (!pick.options.length) for (const v of p.sample_interval_presets_ms) pick.appendChild(el("option", { value: String(v) }, fmtInterval(v)));
  if (!pick.dataset.touched) pick.value = String(p.sample_interval_ms);
  const t = $("requests"); t.textContent = "";
  let waiting = false;
  if (p.requests.length) t.appendChild(el("tr", {}, ...["Requested", "Layer", "Window", "Outcome", "Captures"].map(h => el("th", {}, h))));
  for (const r of p.requests.slice().reverse()) {
    // A profiling request always heads for an end (captured, rejected, ended, expired); an interval change
    // ends when every node's sampler took it.
    const pending = r.state ? ["waiting", "started", "storing"].includes(r.state) : !r.picked_up_us;
    waiting = waiting || pending;
    const picked = r.state ? r.message : r.picked_up_us ? fmtUs(r.picked_up_us) : "waiting for the job…";
    const perNode = r.layer === "interval" && r.nodes && r.nodes.length > 1 ? " (" + r.nodes.map(n => `${n.node}: ${n.picked_up_us ? fmtUs(n.picked_up_us) : "waiting"}`).join(", ") + ")" : "";
    t.appendChild(el("tr", { dataset: { layer: r.layer, state: r.state || (pending ? "waiting" : "done") } }, el("td", {}, fmtUs(r.requested_us)), el("td", { class: "text" }, r.layer), el("td", { class: "text" }, r.range),
      el("td", { class: "text picked" }, picked + perNode), el("td", { class: "text" }, ...r.captures.map(captureLinks))));
  }
  if (state.captureCount !== undefined && p.captures.length !== state.captureCount) {  // a new capture: its operators
    runApi("operators").then(renderOperators).catch(showError);
    runApi("functions").then(renderFunctions).catch(showError);
  }
  state.captureCount = p.captures.length;
  const c = $("captures"); c.textContent = "";
  if (!p.captures.length) c.appendChild(el("tr", {}, el("td", { class: "muted" }, "No capture yet.")));
  else c.appendChild(el("tr", {}, ...["Layer", "Start", "Steps", "Files and timeline"].map(h => el("th", {}, h))));
  for (const w of p.captures.slice().reverse()) {
    const steps = w.first_step === null || w.first_step === undefined ? "–" : `${w.first_step}–${w.last_step ?? "…"}`;
    c.appendChild(el("tr", { dataset: { layer: w.layer } }, el("td", { class: "text" }, w.layer), el("td", {}, fmtUs(w.start_us)), el("td", {}, steps), el("td", { class: "text" }, captureLinks(w))));
  }
  clearTimeout(state.profilingTimer);
  if (waiting && state.view === "overview") state.profilingTimer = setTimeout(() => runApi("profiling").then(renderProfiling).catch(requestsCut), 2000);
}

// The server is gone while requests were open (`stallwatch run --dashboard` stops its dashboard when the job
// ends): each open request still ends on the page, saying why it cannot be followed.
function requestsCut(e) {
  for (const row of document.querySelectorAll("#requests tr[data-state=waiting], #requests tr[data-state=started], #requests tr[data-state=storing]")) {
    row.dataset.state = "ended";
    row.querySelector(".picked").textContent = (state.summary && state.summary.fate.state !== "running" ? "the job ended" : "the dashboard stopped") +
      " before this request ended (a dashboard started by `run --dashboard` ends with the job); its capture, if any, is in the run";
  }
  showError(e);
}

async function submitInterval(ev) {
  ev.preventDefault();
  $("profile-error").textContent = "";
  try {
    const p = await api(`/api/run/${encodeURIComponent(state.run)}/profiling`, { method: "POST", body: JSON.stringify({ interval_ms: Number($("interval-pick").value) }),
      headers: { "content-type": "application/json", "x-stallwatch": "1" } });
    delete $("interval-pick").dataset.touched;
    renderProfiling(p);
  } catch (e) { $("profile-error").textContent = e.message; }
}

async function submitProfiling(ev) {
  ev.preventDefault();
  const f = new FormData($("profile-form")), body = { layer: f.get("layer") };
  for (const k of ["start_step", "num_steps", "duration_s"]) if (f.get(k)) body[k] = f.get(k);
  $("profile-error").textContent = "";
  try {
    const p = await api(`/api/run/${encodeURIComponent(state.run)}/profiling`, { method: "POST", body: JSON.stringify(body),
      headers: { "content-type": "application/json", "x-stallwatch": "1" } });
    renderProfiling(p);
  } catch (e) { $("profile-error").textContent = e.message; }
}

// -- nodes ---------------------------------------------------------------------------------------------------
// The Nodes view's time charts share one x range (Plots.Group): zoom or pan one and all follow; a settled zoom
// asks the server for that range at full resolution.
const NODE_CHARTS = ["chart-cpu", "chart-net", "chart-gpu", "chart-gpumem", "chart-mem", "chart-jobmem", "chart-tracks", "chart-events", "chart-heat"];
let group = null;
function nodeGroup() {
  if (!group) group = new Plots.Group(NODE_CHARTS, (x0, x1) => { state.from = x0; state.to = x1; writeHash(); loadTimeline(false).catch(showError); });
  return group;
}
// The range the charts show: the zoom, else the node's samples (the whole run, up to the present).
function extent() {
  if (state.from !== null) return [state.from, state.to];
  const t = state.timeline;
  return t && t.ts.length ? [t.ts[0], t.ts[t.ts.length - 1]] : null;
}
function rangeSpec() { const e = extent(); return e ? [Plots.ms(e[0]), Plots.ms(e[1])] : null; }

async function renderNodes() {
  if (!state.summary) state.summary = await runApi("summary");
  renderHeader(state.summary);
  const nodes = state.summary.nodes.map(n => n.name);
  if (!state.node || !nodes.includes(state.node)) state.node = nodes[0];
  const pick = $("node-pick"); pick.textContent = "";
  for (const n of nodes) pick.appendChild(el("option", n === state.node ? { value: n, selected: "" } : { value: n }, n));
  nodeGroup();
  writeHash();
  await loadTimeline(true);
  loadSteps().catch(showError);
  loadHeatmap().catch(showError);
  renderBadges();
}

// Utilization per core and GPU over the run: the report's heatmap (Viridis, colour bar), on the group's time axis.
async function loadHeatmap() {
  const h = await runApi("heatmap", { node: state.node });
  const rows = h.names || [], values = h.values || [];
  const spec = { kind: "heatmap", title: "utilization per core / GPU over the run (%)", rows, values, low: 0, high: 100, unit: "%",
                 x0: Plots.ms(h.start_us || 0), dx: Plots.ms(h.width_us || 1), na: "not applicable: no utilization snapshot on this node yet" };
  const r = rangeSpec(); if (r) spec.x_range = r;
  await Plots.draw("chart-heat", spec);
  $("chart-heat").dataset.cells = String(rows.length * (values[0] || []).length);
  $("chart-heat").dataset.palette = "viridis";
  nodeGroup().link();
}

async function loadTimeline(first) {
  if (state.view !== "nodes") return;
  const q = { node: state.node, points: String(Math.min(Math.max(Math.round(($("chart-cpu").clientWidth || 800) / 2), 200), 1500)) };
  if (state.from !== null) { q.from = String(Math.floor(state.from)); q.to = String(Math.ceil(state.to)); }
  const t = await runApi("timeline", q);
  if (state.from === null) mergeRecent(t, true);  // the whole run: up to the present
  state.timeline = t;
  if (t.last_sample_us) state.lastSample[t.node] = Math.max(state.lastSample[t.node] || 0, t.last_sample_us);
  if (first) pickers(t);
  const e = extent(); if (e) nodeGroup().setExtent(e[0], e[1], !first && state.from !== null);
  drawTimeline();
  $("range-label").textContent = t.snapshots ? `${t.snapshots.toLocaleString()} snapshots · ${t.full_resolution ? "full resolution" : `min/max per ${fmtDur(t.bucket_us / 1e6)}`}` : "no snapshots in this range";
  const range = state.from !== null ? { from: String(Math.floor(state.from)), to: String(Math.ceil(state.to)) } : {};
  loadTracks(range).catch(showError);
  const ev = await runApi("events", { node: state.node, ...range });
  drawEvents(ev);
}

// The ranks' phase tracks and the job's memory of the range in view (the server reads them; whole-run answers of
// a long run are refused there, and the page says to zoom in).
async function loadTracks(range) {
  const [tr, mem] = await Promise.all([runApi("tracks", { node: state.node, ...range }), runApi("memory", { node: state.node, ...range })]);
  if (!state.timeline) return;
  const [spec, kinds] = Plots.tracksSpec(tr, rangeSpec());
  const box = $("chart-tracks");
  box.dataset.ranks = String(tr.ranks.length);
  box.dataset.mode = tr.aggregated ? "buckets" : "blocks";
  box.dataset.blocks = String(tr.total_blocks);
  box.dataset.kinds = [...kinds].join(",");
  $("tracks-note").textContent = tr.zoom_in ? "This run holds too many events to draw its ranks over the whole run: zoom in (wheel) or pick a finding's window."
    : !tr.ranks.length ? "No step recorded on this node in this range."
    : tr.aggregated ? `${tr.total_blocks.toLocaleString("en-US")} phase blocks: each ${fmtDur(tr.bucket_us / 1e6)} bucket is split by the share of its time in each phase — zoom in to see the blocks.` : "";
  const P = Cat.palette(), lines = [];
  mem.series.forEach((m, i) => lines.push({ name: `rank ${m.rank} ${m.label}`, color: m.field === "rss_kb" ? P[i % P.length] : P[(i + 3) % P.length], ts: mem.ts, values: m.mb }));
  const none = !lines.length;
  $("chart-jobmem").hidden = none;
  $("jobmem-na").hidden = !none;
  $("jobmem-na").textContent = none ? "The job's own memory (RSS, CUDA allocator) was not recorded with its steps on this node." : "";
  const draws = [Plots.draw("chart-tracks", spec)];
  if (!none) draws.push(Plots.draw("chart-jobmem", Plots.timeSpec({ title: "the job's memory per rank (MiB)", yLabel: "MiB", lines, range: rangeSpec() })));
  await Promise.all(draws);
  nodeGroup().link();
}

function pickers(t) {
  const mk = (box, names, set, label) => {
    box.textContent = "";
    for (const n of names) {
      const cb = el("input", { type: "checkbox", value: n, dataset: { device: n } }); cb.checked = set.has(n);
      cb.addEventListener("change", () => { if (cb.checked) set.add(n); else set.delete(n); drawTimeline(); });
      box.appendChild(el("label", {}, cb, label(n)));
    }
  };
  mk($("core-pick"), t.cores, state.cores, n => n);
  mk($("gpu-pick"), t.gpus, state.gpus, n => n);
  // A node without GPUs draws no empty GPU charts: one line says why.
  const noGpu = !t.gpus.length;
  for (const id of ["chart-gpu", "chart-gpumem"]) $(id).hidden = noGpu;
  $("gpu-pick").parentElement.hidden = noGpu;
  let na = $("gpu-na");
  if (!na) { na = el("p", { id: "gpu-na", class: "muted not-applicable" }); $("chart-gpu").before(na); }
  na.hidden = !noGpu;
  na.textContent = noGpu ? `No GPU on node ${t.node}: GPU utilization and GPU memory do not apply.` : "";
}

function line(t, key, name, color, band) {
  const s = t.series[key]; if (!s) return null;
  return { name, color, ts: t.ts, values: s.mean, lo: band ? s.min : null, hi: band ? s.max : null };
}

function drawTimeline() {
  const t = state.timeline; if (!t) return;
  const P = Cat.palette(), range = rangeSpec();
  const M = (device, metric) => (Cat.metric(device, metric) || { colour: P[0] }).colour;
  const flagged = state.flagged || [];
  const spans = flagged.length ? [{ label: "where the finding fired", from: flagged.map(w => w[0]), to: flagged.map(w => w[1]) }] : [];
  const gpuBand = t.series.gpu_lo ? { name: "GPUs (lowest – highest)", color: M("gpu0", "gpu_util"), ts: t.ts, values: t.series.gpu.mean, lo: t.series.gpu_lo.min, hi: t.series.gpu_hi.max } : line(t, "gpu", "mean of GPUs", M("gpu0", "gpu_util"));
  const charts = [
    ["chart-cpu", { title: Cat.title("cpu", "cpu_util", "CPU utilization") + " (%)", percent: true, lines: [line(t, "cpu", "all cores", M("cpu", "cpu_util"), true), line(t, "job", "this job", M("proc", "cpu_util"), true), ...[...state.cores].map((c, i) => line(t, c, c, P[(i + 1) % P.length]))] }],
    ["chart-net", { title: Cat.title("net", "net_bps", "Network") + " (MB/s)", yLabel: "MB/s", lines: [line(t, "net_rx", "received", M("net", "net_rx_bps"), true), line(t, "net_tx", "sent", M("net", "net_tx_bps"), true)] }],
    ["chart-mem", { title: "CPU memory and I/O wait (%)", percent: true, lines: [line(t, "memory", "memory", M("memory", "mem_util"), true), line(t, "iowait", "I/O wait", M("cpu", "cpu_iowait"), true)] }],
  ];
  if (t.gpus.length) {
    charts.push(["chart-gpu", { title: Cat.title("gpu0", "gpu_util", "GPU utilization") + " (%)", percent: true, lines: [gpuBand, ...[...state.gpus].map((g, i) => line(t, g, g, P[(i + 3) % P.length]))] }]);
    charts.push(["chart-gpumem", { title: Cat.title("gpu0", "gpu_mem_util", "GPU memory") + " (% used)", percent: true, lines: [line(t, "gpu_mem", "mean of GPUs", M("gpu0", "gpu_mem_util"), true), ...[...state.gpus].map((g, i) => line(t, g + "_mem", g, P[(i + 3) % P.length]))] }]);
  }
  Promise.all(charts.map(([id, o]) => Plots.draw(id, Plots.timeSpec({ ...o, spans, range })))).then(() => nodeGroup().link());
}

function drawEvents(ev) {
  // Few events: each step's duration at its start, data waits shaded. Too many (a whole run): per time bucket the
  // mean step and, stacked under it, each phase's time per step (from the rollups, or the events, in buckets).
  const box = $("brush-list"), chart = $("chart-events");
  chart.dataset.mode = ev.truncated ? "buckets" : "events";
  let spec;
  if (ev.truncated) {
    const b = ev.buckets || [], ts = b.map(x => x.start_us), lines = [];
    let below = b.map(() => 0);
    for (const k of ["data_wait", "forward", "backward", "optimizer"]) {
      if (!b.some(x => x.phases_ms[k] !== undefined)) continue;
      const top = b.map((x, i) => below[i] + (x.phases_ms[k] || 0));
      lines.push({ name: Cat.label(k), color: Cat.colour(k), ts, values: top, lo: below, hi: top });
      below = top;
    }
    lines.push({ name: "step (mean per bucket)", color: Cat.colour("TRAIN"), ts, values: b.map(x => x.step_ms) });
    chart.dataset.buckets = String(b.length);
    spec = Plots.timeSpec({ title: "steps and phases (ms)", yLabel: "ms", lines, range: rangeSpec(), brush: true, height: 170 });
  } else {
    const steps = ev.events.filter(e => e.kind === "step"), waits = ev.events.filter(e => e.kind === "data_wait");
    spec = Plots.timeSpec({ title: "steps and phases (ms)", yLabel: "ms", range: rangeSpec(), brush: true, height: 170,
      lines: [{ name: "step", color: Cat.colour("TRAIN"), ts: steps.map(e => e.start_us), values: steps.map(e => (e.end_us - e.start_us) / 1000) }],
      spans: [{ label: Cat.label("data_wait"), from: waits.map(e => e.start_us), to: waits.map(e => e.end_us) }] });
  }
  Plots.draw("chart-events", spec).then(h => {
    if (h && !chart.dataset.brushHooked) { chart.dataset.brushHooked = "1"; Draw.onBrush(chart, (x0, x1) => brushed(x0 * 1000, x1 * 1000).catch(showError)); }
    nodeGroup().link();
  });
  if (box.dataset.brushed) return;
  const width = ev.buckets && ev.buckets.length ? ev.buckets[0].width_us : 0;
  box.textContent = ev.truncated ? `${ev.total_events.toLocaleString()} events in view, drawn per ${width < 1e6 ? `${Math.round(width / 1000)} ms` : fmtDur(width / 1e6)}: zoom in (or drag an interval) to see them one by one. ` : "";
  box.appendChild(totalsTable(ev));
}

function totalsTable(ev) {
  const t = el("table", { class: "data" }, el("tr", {}, el("th", {}, "event"), el("th", {}, "count"), el("th", {}, "time")));
  for (const x of ev.totals) t.appendChild(el("tr", {}, el("td", {}, Cat.label(x.kind)), el("td", {}, x.count.toLocaleString("en-US")), el("td", {}, Cat.fmt(x.total_s, "s"))));
  return t;
}

async function brushed(x0, x1) {
  const ev = await runApi("events", { node: state.node, from: String(Math.floor(x0)), to: String(Math.ceil(x1)) });
  const box = $("brush-list"); box.textContent = ""; box.dataset.brushed = "1";
  box.appendChild(el("p", {}, `${Plots.fmtTime(x0)} – ${Plots.fmtTime(x1)}: ${ev.steps} steps`));
  box.appendChild(totalsTable(ev));
  if (!ev.truncated && ev.events.length <= 60) {
    const t = el("table", { class: "data" }, el("tr", {}, ...["kind", "name", "rank", "step", "start", "ms"].map(h => el("th", {}, h))));
    for (const e of ev.events) t.appendChild(el("tr", {}, el("td", {}, Cat.label(e.kind)), el("td", { class: "text" }, e.name), el("td", {}, String(e.rank)), el("td", {}, e.step === null ? "" : String(e.step)), el("td", {}, Plots.fmtTime(e.start_us)), el("td", {}, Cat.number((e.end_us - e.start_us) / 1000))));
    box.appendChild(t);
  }
}

async function loadSteps() {
  const s = await runApi("steps", { node: state.node, last: "200" });
  drawSteps(s.steps);
}
// The newest steps (all modes); one mode is drawn at a time (the picker), so TRAIN and EVAL never share an axis.
let recentSteps = [];
function drawSteps(steps) {
  recentSteps = steps.slice(-400);
  const order = ["data_wait", "forward", "backward", "optimizer", "collective", "other"];  // step_window.BREAKDOWN_KINDS, the rest
  const modes = [...new Set(recentSteps.map(s => s.mode).filter(Boolean))].sort((a, b) => (a !== "TRAIN") - (b !== "TRAIN") || a.localeCompare(b));
  const pick = $("steps-mode");
  if ([...pick.options].map(o => o.value).join() !== modes.join()) {
    const was = pick.value; pick.textContent = "";
    for (const m of modes) pick.appendChild(el("option", { value: m }, m));
    pick.value = modes.includes(was) ? was : (modes[0] || "");
  }
  const mode = pick.value, mine = recentSteps.filter(s => s.mode === mode).slice(-30);
  $("chart-steps").dataset.stepMode = mode;
  const cats = mine.map(s => String(s.step ?? "")), parts = mine.map(s => Object.assign({ other: s.other_ms }, s.phases_ms));
  // every part these steps have (a DDP job's exposed all-reduce among them), in the catalogue's order
  const seen = new Set(parts.flatMap(p => Object.keys(p).filter(k => p[k] > 0)));
  const keys = [...order.filter(k => seen.has(k)), ...[...seen].filter(k => !order.includes(k)).sort()];
  const box = $("chart-steps");
  box.dataset.bars = String(mine.length);
  box.dataset.last = cats.length ? cats[cats.length - 1] : "";
  Plots.draw("chart-steps", { kind: "bars", title: mode ? `time per ${mode} step (ms)` : null, stacked: true, categories: cats, y_label: "ms", height: 220,
    series: keys.map(k => ({ name: Cat.label(k), color: Cat.colour(k), values: parts.map(p => p[k] || 0) })), na: "no steps yet" })
    .then(() => { box.dataset.colours = JSON.stringify(Plots.series("chart-steps")); });
}

function renderBadges() {
  const box = $("node-badges"); box.textContent = "";
  const now = Date.now() * 1000 + state.clockSkew;
  for (const n of (state.summary ? state.summary.nodes : [])) {
    const last = state.lastSample[n.name] || n.end_us;
    const age = last ? Math.max(0, (now - last) / 1e6) : null;
    const running = n.status === "running" || n.status === "starting";
    const text = age === null ? `${n.name}: no sample yet` : running ? `${n.name}: last sample ${age < 120 ? age.toFixed(0) + " s" : fmtDur(age)} ago` : `${n.name}: ${n.status || "ended"}`;
    box.appendChild(el("span", { class: "node-badge" + (running && age > 30 ? " stale" : ""), dataset: { node: n.name } }, text));
  }
}

// -- ranks ---------------------------------------------------------------------------------------------------
async function renderRanks() {
  if (!state.summary) { state.summary = await runApi("summary"); renderHeader(state.summary); }
  const r = await runApi("ranks", { mode: $("mode-pick").value });
  const box = $("straggler"); box.textContent = "";
  const hl = new Set();
  for (const f of r.straggler) {
    for (const rk of f.where.ranks) hl.add(rk);
    box.appendChild(el("div", { class: "finding " + f.severity }, el("div", { class: "title" }, f.title), el("div", {}, f.recommendation)));
  }
  renderRankParts(r, hl);
  if (!r.ranks.length) { for (const id of ["chart-rank-steps", "chart-rank-wait"]) Plots.forget(id); $("chart-rank-steps").textContent = "No steps of this mode."; return; }
  const top = Math.max(1, ...r.step_ms.flat().filter(v => v !== null));
  const heat = (id, values, title, high, unit) => Plots.draw(id, { kind: "step_heatmap", title, rows: r.ranks, values, x0: r.first_step, dx: r.steps_per_column,
                                                                    low: 0, high, unit, highlight: [...hl] })
    .then(() => { $(id).dataset.cells = String(r.ranks.length * (values[0] || []).length); $(id).dataset.palette = "viridis"; });
  heat("chart-rank-steps", r.step_ms, `mean step time (ms), ${r.steps_per_column} step${r.steps_per_column > 1 ? "s" : ""} per column`, top, "ms");
  if (r.wait_pct) heat("chart-rank-wait", r.wait_pct, `${Cat.label("data_wait")} (% of step time)`, 100, "%");
  else { Plots.forget("chart-rank-wait"); $("chart-rank-wait").textContent = "No data-wait events recorded."; }
}

// Per rank its mean step split into data wait, compute, exposed communication and the rest (the server's split),
// and its step time: a straggler is the long bar, a communication-bound job the tall pink parts.
function renderRankParts(r, hl) {
  const keys = ["data_wait", "compute", "collective", "other"];
  const rows = (r.parts || []).map(p => ({ name: p.rank, parts: p.parts_ms }));
  const box = $("chart-rank-parts"), t = $("rank-parts"); t.textContent = "";
  if (!rows.length) { Plots.forget("chart-rank-parts"); box.textContent = "No steps of this mode."; delete box.dataset.bars; return; }
  box.dataset.bars = String(rows.length);
  Plots.draw("chart-rank-parts", { kind: "bars", title: `${r.mode} steps: mean per step (ms)${hl.size ? " — ▶ named by a finding" : ""}`, stacked: true, y_label: "ms", height: 260,
    categories: rows.map(x => (hl.has(x.name) ? "▶ " : "") + x.name),
    series: keys.map(k => ({ name: Cat.label(k), color: Cat.colour(k) || undefined, values: rows.map(x => x.parts[k] || 0) })) });
  t.appendChild(el("tr", {}, ...["Rank", "Steps", "p50", "p95", "mean", Cat.label("data_wait"), "compute", Cat.label("collective"), Cat.label("other")].map(h => el("th", {}, h))));
  const ms = v => Cat.fmt(v, "ms");
  for (const p of r.parts) {
    t.appendChild(el("tr", { dataset: { rank: p.rank }, class: hl.has(p.rank) ? "straggler-row" : "" }, el("td", {}, p.rank), el("td", {}, p.steps.toLocaleString("en-US")),
      el("td", {}, ms(p.p50_ms)), el("td", {}, ms(p.p95_ms)), el("td", {}, ms(p.mean_ms)),
      ...keys.map(k => el("td", {}, ms(p.parts_ms[k])))));
  }
  const sources = new Set(r.parts.map(p => p.communication_from).filter(Boolean));
  t.appendChild(el("caption", { class: "muted" }, sources.size ? `communication: the exposed part of DDP's gradient all-reduce (${[...sources].map(x => x === "timed" ? "timed on the host" : "DDP's sampled averages").join(", ")}), taken out of backward` : "no DDP gradient all-reduce recorded: communication is 0"));
}

// -- stacks --------------------------------------------------------------------------------------------------
// The newest Python stacks of each rank's processes, as text (run data: textContent only, never HTML).
async function renderStacks() {
  if (!state.summary) { state.summary = await runApi("summary"); renderHeader(state.summary); }
  const d = await runApi("stacks"), box = $("stacks"); box.textContent = "";
  box.dataset.dumps = String(d.dumps.length);
  if (!d.dumps.length) { box.appendChild(el("p", { class: "muted not-applicable" }, "No stack dump in this run: stacks are taken when the Hang rule sees a rank stop making progress.")); return; }
  for (const dump of d.dumps) {
    const lines = [];
    for (const th of dump.threads) {
      lines.push(`Thread ${th.name}${th.main ? " (main)" : ""}${th.daemon ? " (daemon)" : ""}:`);
      for (const f of th.frames) lines.push(`  ${f.file}:${f.line} in ${f.function}` + (f.code ? `\n      ${f.code}` : ""));
      if (th.frames_left_out) lines.push(`  … ${th.frames_left_out} frames left out`);
    }
    if (dump.threads_left_out) lines.push(`… ${dump.threads_left_out} threads left out`);
    box.appendChild(el("div", { class: "stack-dump", dataset: { rank: `${dump.node}/${dump.rank}` } },
      el("h3", {}, `${dump.node}/${dump.rank}`, el("span", { class: "muted" }, ` · pid ${dump.pid} · ${fmtUs(dump.at_us)} · ${dump.threads.length} thread${dump.threads.length === 1 ? "" : "s"}`)),
      el("pre", { class: "stack-text" }, lines.join("\n"))));
  }
}

// -- live ----------------------------------------------------------------------------------------------------
function connectLive() {
  if (state.source) { state.source.close(); state.source = null; }
  if (!state.run || document.hidden) { $("live").classList.remove("on"); return; }
  const src = new EventSource(`/api/run/${encodeURIComponent(state.run)}/live`);
  state.source = src;
  src.addEventListener("open", () => $("live").classList.add("on"));
  src.addEventListener("error", () => $("live").classList.remove("on"));
  src.addEventListener("hello", e => { const d = JSON.parse(e.data); state.clockSkew = d.now_us - Date.now() * 1000; });
  src.addEventListener("samples", e => onSamples(JSON.parse(e.data)));
  src.addEventListener("summary", e => onSummary(JSON.parse(e.data)));
  src.addEventListener("steps", e => onSteps(JSON.parse(e.data)));
  src.addEventListener("status", e => onStatus(JSON.parse(e.data)));
  src.addEventListener("changed", () => onChanged());
  src.addEventListener("resync", () => { render().catch(showError); });
}

// The newest streamed snapshots per node, whatever the view: a timeline read from the store (which trails the job
// by a flush interval) is brought up to the present with them.
const RECENT_SAMPLES = 64;
function onSamples(d) {
  state.clockSkew = d.now_us - Date.now() * 1000;
  if (d.ts.length) state.lastSample[d.node] = Math.max(state.lastSample[d.node] || 0, d.ts[d.ts.length - 1]);
  const r = state.recent[d.node] || (state.recent[d.node] = { ts: [], series: {} });
  for (let i = 0; i < d.ts.length; i++) {
    if (r.ts.length && d.ts[i] <= r.ts[r.ts.length - 1]) continue;
    r.ts.push(d.ts[i]);
    for (const [k, v] of Object.entries(d.series)) (r.series[k] || (r.series[k] = new Array(r.ts.length - 1).fill(null))).push(v[i]);
    for (const [k, v] of Object.entries(r.series)) if (v.length < r.ts.length) v.push(null);
  }
  if (r.ts.length > RECENT_SAMPLES) { const cut = r.ts.length - RECENT_SAMPLES; r.ts.splice(0, cut); for (const v of Object.values(r.series)) v.splice(0, cut); }
  if (state.view === "nodes") renderBadges();
  const t = state.timeline;
  if (!t || state.view !== "nodes" || d.node !== t.node || state.from !== null) return;  // a zoomed view stays put
  if (!mergeRecent(t)) { loadTimeline(false).catch(showError); return; }  // a hole between the two: read it again
  const g = nodeGroup(), e = extent();
  if (e && Date.now() - g.touched > 5000) g.setExtent(e[0], e[1]);  // the whole run grows (not while the user zooms)
  drawTimeline();
}

// Append the node's streamed snapshots newer than the timeline's end; false when they do not join it (a stretch
// stored meanwhile that neither holds).
function mergeRecent(t, force) {
  const r = state.recent[t.node];
  if (!r || !r.ts.length) return true;
  const last = t.ts.length ? t.ts[t.ts.length - 1] : null;
  let i = r.ts.findIndex(x => last === null || x > last);
  if (i < 0) return true;
  if (last !== null && r.ts[i] - last > 3 * Math.max(t.bucket_us, 1) && (i === 0 || r.ts[i - 1] < last - t.bucket_us)) {
    if (!force) return false;
    t.ts.push(Math.round((last + r.ts[i]) / 2));  // a real gap, read again and still there: the line breaks
    for (const s of Object.values(t.series)) { s.min.push(null); s.max.push(null); s.mean.push(null); }
  }
  for (; i < r.ts.length; i++) {
    t.ts.push(r.ts[i]);
    for (const [k, s] of Object.entries(t.series)) {
      const v = r.series[k] ? r.series[k][i] : null;
      s.min.push(v); s.max.push(v); s.mean.push(v);
    }
  }
  return true;
}

function onSteps(d) {
  if (state.view === "nodes" && d.recent.length && d.recent[0].node === state.node) {
    const seen = new Set(recentSteps.map(s => `${s.rank}/${s.step}/${s.start_us}`));
    drawSteps(recentSteps.concat(d.recent.filter(s => !seen.has(`${s.rank}/${s.step}/${s.start_us}`))));
  }
}

function onStatus(d) {
  if (!state.summary) return;
  for (const n of state.summary.nodes) if (d.nodes[n.name]) n.status = d.nodes[n.name].status;
  if (state.view === "nodes") renderBadges();
  const ended = Object.values(d.nodes).every(n => n.status !== "running" && n.status !== "starting");
  if (ended && state.view === "overview" && document.querySelector("#requests tr[data-state]")) {
    clearTimeout(state.profilingTimer);  // the job ended: what became of each request, now (the server may stop soon)
    runApi("profiling").then(renderProfiling).catch(requestsCut);
  }
}

function onChanged() {
  // The whole-run answers (summary, findings) are asked again at most every 10 s while data arrives.
  state.changedAt = Date.now();
  if (state.refreshTimer) return;
  // (the summary itself comes with the live stream, up to date within a second or two)
  const wait = Math.max(1000, 10000 - (Date.now() - (state.refreshedAt || 0)));
  state.refreshTimer = setTimeout(() => {
    state.refreshTimer = null; state.refreshedAt = Date.now();
    if (state.view === "nodes" && state.from === null) {  // the framework timeline and heatmap of the new data
      runApi("events", { node: state.node }).then(drawEvents).catch(showError);
      loadTracks({}).catch(showError);
      loadHeatmap().catch(showError);
    }
    if (state.view !== "overview") return;
    loadFindings();
    runApi("usage").then(renderUsage).catch(showError);
    runApi("operators").then(renderOperators).catch(showError);
  }, wait);
}

// -- start ---------------------------------------------------------------------------------------------------
document.addEventListener("visibilitychange", () => {
  if (document.hidden) { if (state.source) { state.source.close(); state.source = null; $("live").classList.remove("on"); } }
  else connectLive();
});
window.addEventListener("DOMContentLoaded", async () => {
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => { if (b.dataset.view !== "nodes") state.flagged = null; show(b.dataset.view); });
  $("node-pick").addEventListener("change", e => { state.node = e.target.value; state.cores.clear(); state.gpus.clear(); renderNodes().catch(showError); });
  $("reset-zoom").addEventListener("click", () => {
    state.from = state.to = null; state.flagged = null; delete $("brush-list").dataset.brushed; writeHash();
    loadTimeline(true).then(() => { const e = extent(); if (e) nodeGroup().setExtent(e[0], e[1]); }).catch(showError);
  });
  $("mode-pick").addEventListener("change", () => renderRanks().catch(showError));
  $("steps-mode").addEventListener("change", () => drawSteps(recentSteps));
  $("profile-form").addEventListener("submit", submitProfiling);
  $("compare-form").addEventListener("submit", submitCompare);
  $("interval-form").addEventListener("submit", submitInterval);
  $("interval-pick").addEventListener("change", () => { $("interval-pick").dataset.touched = "1"; });
  setInterval(() => { if (state.view === "nodes") renderBadges(); if (state.view === "runs") tickRuns(); tickDuration(); }, 1000);
  window.addEventListener("hashchange", onHashChange);
  readHash();
  try {
    await Cat.load();
    Draw.setCatalogue(Cat.doc);  // the report's renderer, with the same colours
    Draw.setOptions({ eval: false, clock: true, border_left: 64 });  // no eval (this page's CSP), clock times, aligned axes
    const runs = await api("/api/runs");
    state.runs = runs;
    if (!state.run && runs.single && runs.runs.length) state.run = runs.runs[0].id;
    if (state.run) {
      $("download").href = `/api/run/${encodeURIComponent(state.run)}/report`;
      connectLive();
      show(state.view === "runs" ? "overview" : state.view);
    } else show("runs");
  } catch (e) { showError(e); }
});
