// The dashboard's charts: its answers as chart specs drawn by draw.js (present/static: the report's own renderer
// on BokehJS), updated in place as data arrives (the user's zoom kept). A Group is the Nodes view's time charts:
// one x range (wheel-zoom or pan one, all follow), settled zooms asked again of the server. Nothing here computes
// figures: it shapes the server's numbers into specs (µs become the specs' epoch ms).
"use strict";

const Plots = (() => {
  const handles = new Map();  // element id -> Draw handle
  const ms = us => (us === null || us === undefined ? null : us / 1000);
  const byId = id => document.getElementById(id);

  function fmtTime(us) {
    const d = new Date(us / 1000), p = n => String(n).padStart(2, "0");
    return `${p(d.getUTCHours())}:${p(d.getUTCMinutes())}:${p(d.getUTCSeconds())}`;
  }

  // Draw `spec` into element `id`: in place when it was drawn before (same series: new data, same zoom). Draws of
  // one element run one after the other (a chart still being shown is never drawn over); a promise of the handle.
  const pending = new Map();
  function draw(id, spec) {
    const next = (pending.get(id) || Promise.resolve()).then(() => {
      const el = byId(id);
      let h = handles.get(id);
      if (h && h.el === el && h.view) h.update(spec);
      else { if (h && h.view) h.view.remove(); h = Draw.render(el, spec); handles.set(id, h); }
      return h.ready.then(() => h);
    }).catch(err => { console.warn("stallwatch: a chart failed", err); return null; });
    pending.set(id, next);
    return next;
  }
  function forget(id) {
    const h = handles.get(id);
    if (h && h.view) h.view.remove();
    handles.delete(id);
    pending.delete(id);
    byId(id).replaceChildren();
  }
  const handle = id => handles.get(id) || null;

  // One x range for the charts of `ids`. `onSettle(x0_us, x1_us)` once the user stops zooming or panning (not when
  // the page itself moves the range). Each chart's element carries its range in µs (data-x0, data-x1).
  class Group {
    constructor(ids, onSettle) {
      this.ids = ids; this.onSettle = onSettle; this.touched = 0; this.linked = new Set(); this.extent = null;
      for (const id of ids) {
        for (const ev of ["wheel", "pointerdown", "touchstart", "dblclick"]) {
          byId(id).addEventListener(ev, () => { this.touched = Date.now(); }, { capture: true, passive: true });
        }
      }
    }
    // The range every chart of the group shows (a new chart starts on it); moves the drawn ones unless `keep`.
    setExtent(x0us, x1us, keep) {
      this.extent = [ms(x0us), ms(Math.max(x1us, x0us + 1))];
      if (keep) return;
      for (const id of this.ids) {  // what the charts show, at once (the drawing follows)
        byId(id).dataset.x0 = String(Math.round(x0us)); byId(id).dataset.x1 = String(Math.round(Math.max(x1us, x0us + 1)));
      }
      for (const id of this.ids) {
        const h = handles.get(id);
        if (h && h.xRange) h.xRange.setv({ start: this.extent[0], end: this.extent[1] });
      }
    }
    get xRange() { return this.extent; }
    // After drawing: link the charts' ranges (new ones after a redraw), and mark each element with its range.
    async link() {
      await Promise.all(this.ids.map(id => pending.get(id)));
      const hs = this.ids.map(id => handles.get(id)).filter(h => h);
      const live = hs.filter(h => h.xRange);
      const fresh = live.filter(h => !this.linked.has(h.xRange));
      for (const h of live) mark(h);
      if (!fresh.length) return;
      for (const h of fresh) {
        this.linked.add(h.xRange);
        const r = h.xRange, el = h.el;
        const note = () => mark({ xRange: r, el });
        r.properties.start.change.connect(note);
        r.properties.end.change.connect(note);
      }
      Draw.linkX(live, (x0, x1) => {
        if (Date.now() - this.touched > 5000) return;  // the page moved it (new data), not the user
        this.extent = [x0, x1];
        this.onSettle(x0 * 1000, x1 * 1000);
      });
    }
  }
  function mark(h) {
    const r = h.xRange;
    if (!r || !Number.isFinite(r.start) || !Number.isFinite(r.end)) return;
    h.el.dataset.x0 = String(Math.round(r.start * 1000));
    h.el.dataset.x1 = String(Math.round(r.end * 1000));
  }

  // A time chart of one panel: lines of {name, ts (µs), values, lo?, hi?, color?}; spans [{label, from, to}] (µs).
  function timeSpec({ title, percent, yLabel, lines, spans, height, range, brush }) {
    const spec = { kind: "time", title: null, panel_height: height || 180,
                   panels: [{ title, percent: !!percent, y_label: yLabel || null,
                              lines: lines.filter(Boolean).map(l => ({ name: l.name, x: l.ts.map(ms), y: l.values,
                                                                       ...(l.lo && l.hi ? { lo: l.lo, hi: l.hi } : {}),
                                                                       ...(l.color ? { color: l.color } : {}) })) }],
                   spans: (spans || []).filter(s => s.from.length).map(s => ({ label: s.label, x0: s.from.map(ms), x1: s.to.map(ms) })),
                   na: `not applicable: no ${title || "data"} in this range` };
    if (range) spec.x_range = range;
    if (brush) { spec.brush = true; spec.brush_active = true; }
    return spec;
  }

  // One track per rank of phase blocks, from the server's tracks answer: blocks as they are; zoomed out, each
  // bucket as consecutive blocks as wide as each phase's share of it.
  function tracksSpec(doc, range) {
    const tracks = [], kinds = new Set();
    for (const rank of doc.ranks) {
      const t = { name: `rank ${rank}`, x0: [], x1: [], phase: [] };
      if (doc.aggregated) {
        const per = doc.shares[String(rank)] || {}, w = doc.bucket_us;
        const n = Math.max(0, ...Object.values(per).map(v => v.length));
        for (let j = 0; j < n; j++) {
          let at = doc.bucket_start_us + j * w;
          for (const [k, v] of Object.entries(per)) {
            if (!v[j]) continue;
            kinds.add(k); t.x0.push(ms(at)); at += v[j] * w; t.x1.push(ms(at)); t.phase.push(Cat.label(k));
          }
        }
      } else {
        for (const [k, s, e] of (doc.blocks[String(rank)] || [])) {
          if (k === "step") continue;
          kinds.add(k); t.x0.push(ms(s)); t.x1.push(ms(e)); t.phase.push(Cat.label(k));
        }
      }
      tracks.push(t);
    }
    const spec = { kind: "time", title: null, panels: [], tracks, tracks_title: "Phases per rank",
                   na: "not applicable: no step recorded on this node in this range" };
    if (range) spec.x_range = range;
    return [spec, kinds];
  }

  // The data attributes the page's tests and the screenshot suite read (what was drawn), beside draw.js's own.
  function series(id) {
    try { return JSON.parse(byId(id).dataset.series || "{}"); } catch (e) { return {}; }
  }

  return { draw, forget, handle, Group, timeSpec, tracksSpec, series, fmtTime, ms };
})();
