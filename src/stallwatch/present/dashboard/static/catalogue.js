// The one vocabulary of what is shown, from the server (GET /api/catalogue: stallwatch/catalogue.py and
// stallwatch/units.py): each phase's label and colour, each metric's label, unit and title, the palettes, and
// the units' formatting rules, applied here with the same algorithm as units.format_value (tests compare them).
"use strict";

const Cat = (() => {
  let doc = null;
  const byName = new Map();

  async function load() {
    const r = await fetch("/api/catalogue", { credentials: "same-origin" });
    if (!r.ok) throw new Error(`catalogue: ${r.status} ${r.statusText}`);
    doc = await r.json();
    // the levels' colours (good … issue) as CSS variables: the findings, rule states and run badges are drawn
    // in the report's verdict colours
    for (const [level, c] of Object.entries(doc.levels)) {
      document.documentElement.style.setProperty(`--level-${level}`, c.colour);
      document.documentElement.style.setProperty(`--tint-${level}`, c.tint);
    }
    for (const group of ["step_parts", "modes", "job_parts", "flags"]) {
      for (const p of doc[group]) {
        for (const name of [p.key, p.label, ...p.aliases]) {
          if (!byName.has(name)) byName.set(name, p);
          if (!byName.has(name.toLowerCase())) byName.set(name.toLowerCase(), p);
        }
      }
    }
    return doc;
  }

  const phase = name => byName.get(name) || byName.get(String(name).toLowerCase()) || null;
  // A phase's one colour, by any of its names; null for anything that is no phase.
  const colour = name => { const p = phase(name); return p ? p.colour : null; };
  const label = key => { const p = phase(key); return p ? p.label : String(key); };
  const palette = () => doc ? doc.series_palette : ["#1f77b4"];
  // Colours for one chart's names: a phase's own, the others from the series palette in order (skipping used ones).
  function colours(names) {
    const out = {};
    for (const n of names) { const c = colour(n); if (c) out[n] = c; }
    const used = new Set(Object.values(out));
    let free = palette().filter(c => !used.has(c)); if (!free.length) free = palette();
    let i = 0;
    for (const n of names) if (!(n in out)) out[n] = free[i++ % free.length];
    return out;
  }
  function metric(device, name) {
    if (!doc) return null;
    const exact = doc.metrics.find(m => m.metric === name && m.device === device);
    if (exact) return exact;
    return doc.metrics.find(m => m.metric === name && m.device.endsWith("#") && device.startsWith(m.device.slice(0, -1))
      && /^\d+$/.test(device.slice(m.device.length - 1))) || null;
  }
  const title = (device, name, fallback) => { const m = metric(device, name); return m ? m.title : fallback; };

  // Three significant digits, never scientific, thousands separated (units.number): the charts' own (draw.js).
  const number = x => Draw.number(x);
  // A duration as the report and the terminal say it (timeutil.format_duration): "0.6 s", "4m 05s", "1h 02m 03s".
  function duration(seconds) {
    if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "–";
    const s = Math.max(0, seconds);
    if (s < 60) return `${s.toFixed(1)} s`;
    let whole = Math.round(s);
    if (Math.abs(s % 1) === 0.5 && whole % 2) whole -= 1;  // Python's round(): halves to even
    const sec = whole % 60, min = Math.floor(whole / 60) % 60, hours = Math.floor(whole / 3600);
    const two = n => String(n).padStart(2, "0");
    return hours ? `${hours}h ${two(min)}m ${two(sec)}s` : `${min}m ${two(sec)}s`;
  }
  // A value stored in `unit` as a person reads it (units.format_value): "1.2 kB/s", "350 ms", "93.2 %".
  function fmt(value, unit) {
    if (typeof value !== "number" || !Number.isFinite(value)) return "–";
    const spec = doc && doc.units[unit];
    if (spec && spec.ladder.length) {
      const a = Math.abs(value);
      if (a === 0) { const one = spec.ladder.find(s => s[0] === 1); return `0 ${one ? one[1] : spec.ladder[spec.ladder.length - 1][1]}`; }
      for (const [factor, name] of spec.ladder) if (a >= factor * 0.9995) return `${number(value / factor)} ${name}`;
      const [factor, name] = spec.ladder[spec.ladder.length - 1];
      return `${number(value / factor)} ${name}`;
    }
    if (!unit || unit === "count") return number(value);
    return `${number(value)} ${unit}`;
  }
  // The unit a key's name says (units.unit_of_key): `time_at_stake_s` seconds, `wait_share` %.
  function unitOfKey(key) {
    key = String(key);
    if (doc.key_units[key]) return doc.key_units[key];
    for (const [s, u] of doc.suffix_units) if (key.endsWith(s)) return u;
    return "";
  }
  // A named value as text (units.format_keyed): identifiers as they are, numbers in the unit the name says,
  // moments (…_us since the epoch) as UTC times.
  function value(key, v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "number") {
      key = String(key);
      if (Number.isInteger(v) && doc.plain_keys.some(k => key === k || key.endsWith("_" + k))) return String(v);  // an identifier is whole
      const unit = unitOfKey(key);
      if (unit === "us" && v > doc.moment_us) return new Date(v / 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
      return fmt(v, unit);
    }
    return String(v);
  }
  // Viridis, as the report's heatmaps: `f` in [0, 1]; null: the no-data grey.
  function heat(f) {
    if (!doc) return "#888";
    if (f === null || f === undefined || !Number.isFinite(f)) return doc.no_data_colour;
    const p = doc.heat_palette, i = Math.min(p.length - 1, Math.max(0, Math.floor(f * p.length)));
    return p[i];
  }
  return { load, phase, colour, colours, label, palette, metric, title, number, duration, fmt, unitOfKey, value, heat,
           get doc() { return doc; } };
})();
