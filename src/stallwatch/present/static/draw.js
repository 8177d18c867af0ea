// draw.js: stallwatch's one chart renderer, shared by the HTML report and the live dashboard. It draws chart
// specs (plain JSON made by stallwatch/present/charts.py) with BokehJS's own JS API (bokeh.min.js +
// bokeh-api.min.js, loaded before this file), so both faces draw the same charts the same way and the report
// carries data, not Bokeh documents.
//
// API (stable; only added to):
//   Draw.setCatalogue(doc)        the catalogue (GET /api/catalogue, or the JSON the report embeds): every
//                                 phase's colour, the palettes. A phase's colour is resolved here, on both faces.
//   Draw.render(el, spec) -> handle
//                                 draws one spec into element `el` (its content is replaced). Sets
//                                 el.dataset.points (data points drawn) and el.dataset.series (JSON object:
//                                 legend label / phase -> colour). A spec without data draws nothing: `el` holds
//                                 its one line "not applicable: why" (spec.na) instead. A spec that fails to draw
//                                 leaves one line in `el` saying so (the page's other charts still draw).
//   handle.update(spec)           new data in place (ColumnDataSource.data = ...), keeping the user's zoom; a spec
//                                 of another shape (new series) is redrawn, still keeping the x range.
//   handle.ready                  a Promise of the Bokeh view (resolved once drawn).
//   handle.xRange                 the x range (Bokeh Range1d/DataRange1d) of a time chart, else null.
//   Draw.linkX(handles, onRangeSettled?)
//                                 zoom/pan in one time chart moves all; onRangeSettled(x0, x1) after the user
//                                 stops moving (debounced 250 ms). x in the spec's own unit (epoch ms).
//   Draw.onBrush(el, (x0, x1) => ...)
//                                 with `brush: true` on a time spec, a drag in its brush tool selects an interval.
//   Draw.colour(name), Draw.colours(names), Draw.number(x)   the catalogue's colour lookup; round numbers.
//   Draw.setOptions({eval: false, clock: true, border_left: 64})  [added by the dashboard, dashface] eval: false
//                                 for a page whose CSP forbids evaluating strings (the live dashboard's script-src
//                                 'self'): hovers use no CustomJSHover; clock: datetime axes read HH:MM:SS;
//                                 border_left: every figure's left border in px (stacked charts' axes align).
//   spec.x_range: [x0, x1]        [dashface] on time and heatmap specs: a fixed x range (Range1d) instead of the
//                                 data's extent, so linked charts of different data start on one axis.
//
// Spec kinds (every spec: kind, title, height?, na? (why there is nothing to draw)):
//   time        x in epoch ms (x_type "datetime", default) or plain numbers (x_type "linear", x_label: steps).
//               panels: [{title, y_label, percent, lines: [{name, x, y, lo?, hi?, color?}],
//                         hlines: [{y, label, color?}]}]
//               spans / flags: [{label, x0: [], x1: [], text: []}]   shaded in every panel (flags: also bars
//               in a "Flagged by the rules" track on top, with markers: [{label, x: [], text: []}]).
//               tracks: [{name, x0: [], x1: [], phase: []}]   phase blocks, one row per rank, coloured by phase.
//               colors: {name: colour} overrides; brush: true.
//   heatmap     rows: [names], x0 (epoch ms), dx (ms per column), values: rows × columns (null = no snapshot:
//               a transparent gap), low, high, unit.
//   step_heatmap  the same with x0 = first step, dx = steps per column, highlight: [row names marked ▶].
//   bars        categories, series: [{name, values, color?}] (stacked when `stacked`), points: [{name, values,
//               marker, color?}] (markers over the bars), tips: {column: values} (shown on hover), highlight:
//               [categories drawn in the highlight colour], y_label, width?.
//   histogram   series: [{name, left, right, top}], markers: [{name, x, text}], x_label, y_label, share (top is
//               a fraction, shown as %), log_x, x_range?.
//   pie         slices: [{label, value, color?}] largest first, unit. One slice is a sentence, not a pie.
//   box         categories, lower, p25, p50, p75, upper (+ optional p95, max), y_label.
//   grid        children: [spec], ncols; share_x: time children share one x range.
"use strict";

const Draw = (() => {
  const TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save";
  const PLAIN_TOOLS = "pan,wheel_zoom,box_zoom,reset,save";
  let cat = null;
  const byName = new Map();
  const brushes = new WeakMap();
  const options = { eval: true, clock: false, border_left: null };  // dashface: setOptions({eval: false}) where the page's CSP forbids eval
  function setOptions(o) { Object.assign(options, o || {}); }

  function setCatalogue(doc) {
    cat = doc;
    byName.clear();
    for (const group of ["step_parts", "modes", "job_parts", "flags"]) {
      for (const p of (doc && doc[group]) || []) {
        for (const name of [p.key, p.label, ...(p.aliases || [])]) {
          if (!byName.has(name)) byName.set(name, p);
          if (!byName.has(name.toLowerCase())) byName.set(name.toLowerCase(), p);
        }
      }
    }
  }
  const get = (key, fallback) => (cat && cat[key] !== undefined ? cat[key] : fallback);
  const palette = () => get("series_palette", ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]);
  function colour(name) {
    const p = byName.get(name) || byName.get(String(name).toLowerCase());
    return p ? p.colour : null;
  }
  // Colours for one chart's names: a phase's own, the rest from the series palette in order, skipping the
  // colours the chart's phases use (catalogue.colours in Python).
  function colours(names, given, spare, taken) {
    const out = {};
    for (const n of names) { const c = (given && given[n]) || colour(n); if (c) out[n] = c; }
    const used = new Set([...Object.values(out), ...(taken || [])]);
    const all = spare ? [...palette()].reverse() : palette();  // overlays take spares from the other end
    let free = all.filter(c => !used.has(c)); if (!free.length) free = all;
    let i = 0;
    for (const n of names) if (!(n in out)) out[n] = free[i++ % free.length];
    return out;
  }
  // Three significant digits, never scientific, thousands separated (units.number).
  function number(x) {
    if (x === null || x === undefined || !Number.isFinite(x)) return "–";
    if (x === 0) return "0";
    const a = Math.abs(x), decimals = a >= 100 ? 0 : Math.max(0, 2 - Math.floor(Math.log10(a)));
    let text = x.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
    if (text.includes(".")) text = text.replace(/0+$/, "").replace(/\.$/, "");
    return text === "-0" || text === "" ? "0" : text;
  }
  const nums = a => Float64Array.from(a || [], v => (v === null || v === undefined ? NaN : v));
  const uniq = a => [...new Set(a)];

  // ---- what every chart shares -------------------------------------------------------------------------
  class Ctx {
    constructor() { this.sources = new Map(); this.points = 0; this.series = {}; this.xRange = null; this.figures = []; }
    source(key, data) {
      const src = new Bokeh.ColumnDataSource({ data });
      this.sources.set(key, src);
      return src;
    }
    count(n) { this.points += n; }
    named(label, colour) { if (!(label in this.series)) this.series[label] = colour; }
  }

  let building = null;  // the Ctx being built (its figures are watched for the user's zoom)
  function fig(spec, attrs) {
    const p = Bokeh.Plotting.figure({ sizing_mode: "stretch_width", height: spec.height || 260,
                                      title: spec.title || null, ...attrs });
    p.toolbar.logo = null;
    p.outline_line_color = null;
    if (building) building.figures.push(p);
    if (options.border_left) p.min_border_left = options.border_left;  // dashface
    if (options.clock && attrs && attrs.x_axis_type === "datetime") {  // dashface: clock times on every axis
      p.xaxis.formatter = new Bokeh.DatetimeTickFormatter({ milliseconds: "%H:%M:%S.%3N", seconds: "%H:%M:%S",
        minsec: "%H:%M:%S", minutes: "%H:%M", hourmin: "%H:%M", hours: "%H:%M", days: "%b %d", months: "%b %Y" });
    }
    return p;
  }
  function legend(p, items, where, opts) {
    if (!items.length) return;
    // as many columns above the plot as ~900 px hold at the longest label (long labels never run off the left)
    const longest = Math.max(...items.map(([label]) => String(label).length));
    const ncols = where === "above" ? Math.max(1, Math.min(items.length, 8, Math.floor(900 / (7 * longest + 36)))) : 1;
    const l = new Bokeh.Legend({
      items: items.map(([label, renderers]) => new Bokeh.LegendItem({ label: { value: label }, renderers })),
      click_policy: "hide", label_text_font_size: "9pt", spacing: 4, padding: 4,
      ...(where === "above" ? { orientation: "horizontal", ncols, margin: 0 } : {}), ...(opts || {}) });
    p.add_layout(l, where);
    if (where === "above") p.height += 22 * Math.ceil(items.length / ncols);
  }
  const hover = (renderers, tooltips, formatters) =>
    new Bokeh.HoverTool({ renderers, tooltips, formatters: formatters || {} });
  // Clock times that never repeat at any zoom (05:23:02, 05:23:02.500), the date once under the first tick.
  function timeFormatter() {
    const D = o => new Bokeh.DatetimeTickFormatter({ boundary_scaling: false, ...o });
    const day = "%b %d, %Y";
    const date = D({ microseconds: day, milliseconds: day, seconds: day, minsec: day, minutes: day, hourmin: day,
                     hours: day, days: "%Y", months: "", years: "" });
    return D({ microseconds: "%H:%M:%S.%6N", milliseconds: "%H:%M:%S.%3N", seconds: "%H:%M:%S", minsec: "%H:%M:%S",
               minutes: "%H:%M", hourmin: "%H:%M", hours: "%H:%M", days: "%b %d", months: "%b %Y", years: "%Y",
               context_which: "start", context: date });
  }
  const timeAxis = p => { p.xaxis.formatter = timeFormatter(); };
  const plainY = p => { p.yaxis.formatter = new Bokeh.NumeralTickFormatter({ format: "0,0.[00]" }); };

  // ---- time: panels of lines, shaded spans, a flagged track, phase tracks ---------------------------------
  function time(spec, ctx) {
    const datetime = (spec.x_type || "datetime") === "datetime";
    const xRange = spec.x_range ? new Bokeh.Range1d({ start: spec.x_range[0], end: spec.x_range[1] })  // dashface
      : new Bokeh.DataRange1d({ range_padding: 0.01 });
    ctx.xRange = xRange;
    const axis = { x_axis_type: datetime ? "datetime" : "linear", x_range: xRange,
                   tools: datetime ? TOOLS : PLAIN_TOOLS, active_scroll: datetime ? "xwheel_zoom" : "wheel_zoom" };
    const xTip = datetime ? ["time", "@x{%F %T}"] : [spec.x_label || "x", "@x{0,0}"];
    const xFmt = datetime ? { "@x": "datetime", "@x0": "datetime", "@x1": "datetime" } : {};
    const drawn = new Map();  // label -> its renderers in every figure (a legend click hides them all)
    const keep = (label, r) => { if (!drawn.has(label)) drawn.set(label, []); drawn.get(label).push(r); };
    const spanSrc = {};
    // Shaded in every panel: the phases, and of the flags only those the spec names (the top findings' windows);
    // every flag is a bar in the flagged track (five overlapping shades turned a stretch of the panels black).
    const shade = new Set(spec.shade || []);
    const spans = [...(spec.spans || []), ...(spec.flags || []).filter(f => shade.has(f.label))];
    // one colour per overlay label, the same in the panels and in the flagged track
    const spanCols = colours(uniq([...(spec.spans || []), ...(spec.flags || []), ...(spec.markers || [])]
                                  .map(s => s.label)), spec.colors, true);
    for (const s of spans) {
      spanSrc[s.label] = ctx.source(`span:${s.label}`, { x0: nums(s.x0), x1: nums(s.x1),
        y: s.x0.map(() => s.label), text: (s.text || []).length ? s.text : s.x0.map(() => s.label) });
    }
    const lineNames = uniq((spec.panels || []).flatMap(p => p.lines.map(l => l.name)));
    const lineCols = colours(lineNames, spec.colors, false, Object.values(spanCols));  // never an overlay's
    const figures = [];
    (spec.panels || []).forEach((panel, i) => {
      const p = fig({ height: panel.height || spec.panel_height || 200, title: panel.title },
                    { ...axis, y_axis_label: panel.y_label || null, x_axis_label: datetime ? null : spec.x_label });
      if (panel.percent) p.y_range = new Bokeh.Range1d({ start: 0, end: 105, bounds: [0, 105] });
      else { p.y_range = new Bokeh.DataRange1d({ start: panel.from_zero === false ? NaN : 0 }); plainY(p); }
      for (const s of spans) {
        const r = p.vstrip({ x0: { field: "x0" }, x1: { field: "x1" }, source: spanSrc[s.label],
                             fill_color: spanCols[s.label], fill_alpha: 0.15, line_alpha: 0 });
        keep(s.label, r); ctx.named(s.label, spanCols[s.label]);
      }
      const lines = [];
      panel.lines.forEach((l, j) => {
        const c = l.color || lineCols[l.name];
        if (l.lo && l.hi) {
          const band = ctx.source(`band:${i}:${j}`, { x: nums(l.x), lo: nums(l.lo), hi: nums(l.hi) });
          keep(l.name, p.varea({ x: { field: "x" }, y1: { field: "lo" }, y2: { field: "hi" }, source: band,
                                 fill_color: c, fill_alpha: 0.15 }));
        }
        const src = ctx.source(`line:${i}:${j}`, { x: nums(l.x), y: nums(l.y), name: l.x.map(() => l.name) });
        const r = p.line({ x: { field: "x" }, y: { field: "y" }, source: src, line_color: c, line_width: 1.3 });
        lines.push(r); keep(l.name, r); ctx.named(l.name, c); ctx.count(l.x.length);
      });
      for (const h of panel.hlines || []) {
        p.add_layout(new Bokeh.Span({ location: h.y, dimension: "width", line_color: h.color || get("highlight_colour", "#d62728"),
                                      line_dash: "dashed", line_width: 1.5 }));
      }
      const unit = panel.y_label ? ` ${panel.y_label}` : "";  // 100 %, 3.2 MB/s
      if (lines.length) p.add_tools(hover(lines, [["", "@name"], xTip, ["value", `@y{0,0.[00]}${unit}`]], xFmt));
      figures.push(p);
    });
    const track = flagTrack(spec, axis, ctx, keep, xFmt, spanCols);
    if (track) figures.unshift(track);
    const phases = phaseTracks(spec, axis, ctx, keep, xFmt);
    if (phases) figures.push(phases);
    const first = figures[track ? 1 : 0];
    if (first) legend(first, [...spans.map(s => s.label), ...lineNames].filter(l => drawn.has(l))
      .map(l => [l, drawn.get(l).filter(r => first.renderers.includes(r))]).filter(([, rs]) => rs.length), "above");
    for (const rs of drawn.values()) linkVisible(rs);
    if (spec.brush) brush(figures, ctx);
    figures.slice(0, -1).forEach(p => { p.xaxis.major_label_text_font_size = "0pt"; });
    if (datetime && figures.length) timeAxis(figures[figures.length - 1]);  // one set of dates, under the last
    if (figures.length === 1) return figures[0];
    return stack(figures);
  }

  // Figures one under the other with one toolbar; the merged wheel zoom is the active scroll (set once on the
  // merged toolbar: each figure's own would compete).
  function stack(figures) {
    for (const p of figures) p.toolbar.active_scroll = null;
    const g = Bokeh.Plotting.gridplot(figures.map(f => [f]), { merge_tools: true, toolbar_location: "right",
                                                               sizing_mode: "stretch_width" });
    const wheel = g.toolbar.tools.find(t => /WheelZoom/.test(t.type || "") ||
                                             (t.tools && t.tools.some(u => /WheelZoom/.test(u.type || ""))));
    if (wheel) g.toolbar.active_scroll = wheel;
    return g;
  }

  function flagTrack(spec, axis, ctx, keep, xFmt, cols) {
    const flags = spec.flags || [], marks = spec.markers || [];
    if (!flags.length && !marks.length) return null;
    const rows = uniq([...flags.map(f => f.label), ...marks.map(m => m.label)]);
    const p = fig({ height: 50 + 24 * rows.length, title: "Flagged by the rules" },
                  { ...axis, y_range: new Bokeh.FactorRange({ factors: [...rows].reverse() }) });
    const bars = [], points = [], items = [];
    for (const f of flags) {
      const src = ctx.source(`flag:${f.label}`, { x0: nums(f.x0), x1: nums(f.x1), y: f.x0.map(() => f.label),
                                                  text: (f.text || []).length ? f.text : f.x0.map(() => f.label) });
      const r = p.hbar({ y: { field: "y" }, left: { field: "x0" }, right: { field: "x1" }, height: 0.6, source: src,
                         fill_color: cols[f.label], line_color: cols[f.label], fill_alpha: 0.8 });
      bars.push(r); keep(f.label, r); items.push([f.label, [r]]); ctx.named(f.label, cols[f.label]); ctx.count(f.x0.length);
    }
    for (const m of marks) {
      const src = ctx.source(`mark:${m.label}`, { x: nums(m.x), y: m.x.map(() => m.label),
                                                  text: (m.text || []).length ? m.text : m.x.map(() => m.label) });
      const r = p.scatter({ x: { field: "x" }, y: { field: "y" }, source: src, marker: "inverted_triangle", size: 9,
                            fill_color: cols[m.label], line_color: cols[m.label], fill_alpha: 0.8 });
      points.push(r); keep(m.label, r); items.push([m.label, [r]]); ctx.named(m.label, cols[m.label]); ctx.count(m.x.length);
    }
    if (bars.length) p.add_tools(hover(bars, [["", "@text"], ["from", "@x0{%F %T}"], ["to", "@x1{%F %T}"]], xFmt));
    if (points.length) p.add_tools(hover(points, [["", "@text"], ["time", "@x{%F %T}"]], xFmt));
    p.ygrid.visible = false;
    legend(p, items, "above");
    return p;
  }

  function phaseTracks(spec, axis, ctx, keep, xFmt) {
    const tracks = spec.tracks || [];
    if (!tracks.length) return null;
    const names = tracks.map(t => t.name);
    const phases = uniq(tracks.flatMap(t => t.phase));
    const cols = colours(phases, spec.colors);
    const p = fig({ height: 60 + 22 * names.length, title: spec.tracks_title || "Phases per rank" },
                  { ...axis, y_range: new Bokeh.FactorRange({ factors: [...names].reverse() }) });
    const items = [], rs = [];
    for (const ph of phases) {
      const d = { x0: [], x1: [], y: [], phase: [] };
      for (const t of tracks) t.phase.forEach((q, i) => {
        if (q === ph) { d.x0.push(t.x0[i]); d.x1.push(t.x1[i]); d.y.push(t.name); d.phase.push(q); }
      });
      const src = ctx.source(`phase:${ph}`, { ...d, x0: nums(d.x0), x1: nums(d.x1) });
      const r = p.hbar({ y: { field: "y" }, left: { field: "x0" }, right: { field: "x1" }, height: 0.8, source: src,
                         fill_color: cols[ph], line_color: null });
      rs.push(r); keep(ph, r); items.push([ph, [r]]); ctx.named(ph, cols[ph]); ctx.count(d.x0.length);
    }
    p.add_tools(hover(rs, [["", "@y"], ["phase", "@phase"], ["from", "@x0{%F %T.%3N}"], ["to", "@x1{%F %T.%3N}"]], xFmt));
    p.ygrid.visible = false;
    legend(p, items, "above");
    return p;
  }

  // One renderer hidden (a legend click) hides the label's renderers in every panel.
  function linkVisible(rs) {
    if (rs.length < 2) return;
    for (const r of rs) {
      r.properties.visible.change.connect(() => {
        for (const o of rs) if (o.visible !== r.visible) o.visible = r.visible;
      });
    }
  }

  // A drag selects an interval (the brush is the active drag tool; the wheel still zooms, the toolbar pans).
  function brush(figures, ctx) {
    const tool = new Bokeh.BoxSelectTool({ dimensions: "width", persistent: false });
    for (const p of figures) {
      p.add_tools(tool);
      p.toolbar.active_drag = tool;
      p.on_event("selectiongeometry", ev => {
        const g = ev.geometry;
        if (g && g.x0 !== undefined && ctx.el && brushes.has(ctx.el)) {
          for (const cb of brushes.get(ctx.el)) cb(Math.min(g.x0, g.x1), Math.max(g.x0, g.x1));
        }
      });
    }
  }

  // ---- heatmaps -------------------------------------------------------------------------------------------
  function heat(spec, ctx, steps) {
    const rows = spec.rows || [], values = spec.values || [];
    const n = rows.length, m = n ? values[0].length : 0;
    const flat = new Float64Array(n * m);
    let drawn = 0;
    // image rows run bottom-up: row 0 (the first device) is drawn at y 0 with the y axis reversed
    values.forEach((row, i) => row.forEach((v, j) => {
      flat[i * m + j] = v === null ? NaN : v; if (v !== null) drawn++;
    }));
    ctx.count(drawn);
    const image = Bokeh.require("core/util/ndarray").ndarray(flat, { shape: [n, m] });
    const low = spec.low ?? 0, high = spec.high ?? 100;
    const mapper = new Bokeh.LinearColorMapper({ palette: get("heat_palette", ["#440154", "#fde725"]), low, high,
                                                 nan_color: "rgba(0,0,0,0)" });
    const datetime = !steps;
    const p = fig({ height: spec.height || Math.min(900, Math.max(160, 60 + (steps ? 14 : 12) * n)), title: spec.title },
                  { x_axis_type: datetime ? "datetime" : "linear", tools: TOOLS, active_scroll: "xwheel_zoom",
                    x_axis_label: steps ? "step" : null,
                    x_range: spec.x_range ? new Bokeh.Range1d({ start: spec.x_range[0], end: spec.x_range[1] })  // dashface
                      : new Bokeh.DataRange1d({ range_padding: 0 }),
                    y_range: new Bokeh.Range1d({ start: n, end: 0, bounds: [0, n] }) });
    ctx.xRange = p.x_range;
    if (datetime) timeAxis(p);
    const src = ctx.source("image", { image: [image] });
    p.image({ image: { field: "image" }, x: spec.x0, y: 0, dw: spec.dx * m, dh: n, source: src,
              color_mapper: mapper, anchor: "bottom_left", origin: "bottom_left" });
    const every = Math.max(1, Math.ceil(n / 40));  // at most ~40 labels; hover names every row
    const marked = new Set(spec.highlight || []);
    const ticks = [], overrides = {};
    for (let i = 0; i < n; i += every) { ticks.push(i + 0.5); overrides[i + 0.5] = (marked.has(rows[i]) ? "▶ " : "") + rows[i]; }
    p.yaxis.ticker = new Bokeh.FixedTicker({ ticks });
    p.yaxis.major_label_overrides = new Map(Object.entries(overrides).map(([k, v]) => [Number(k), v]));
    p.ygrid.visible = false;
    if (!options.eval) {  // dashface: no CustomJSHover (eval) — a transparent bar per row names it, the image its value
      const names = ctx.source("rows", { y: rows.map((_, i) => i + 0.5), name: rows, x: rows.map(() => spec.x0 + spec.dx * m / 2) });
      const rowBars = p.rect({ x: { field: "x" }, y: { field: "y" }, width: spec.dx * m, height: 1, source: names,
                               fill_alpha: 0, line_alpha: 0 });
      const xTip = datetime ? ["time", "$x{%F %T}"] : ["step", "$x{0,0}"];
      p.add_tools(new Bokeh.HoverTool({ renderers: [rowBars], tooltips: [["", "@name"], xTip],
                                        formatters: datetime ? { "$x": "datetime" } : {} }));
      p.add_tools(new Bokeh.HoverTool({ renderers: [p.renderers[0]], tooltips: [[spec.value_label || "mean", `@image{0,0.[0]} ${spec.unit || "%"}`]] }));
      p.add_layout(new Bokeh.ColorBar({ color_mapper: new Bokeh.LinearColorMapper({ palette: mapper.palette, low, high }),
                                        width: 10, title: spec.unit || "%" }), "right");
      return p;
    }
    const rowName = new Bokeh.CustomJSHover({ args: { names: rows },
      code: "const i = Math.floor(value); return i >= 0 && i < names.length ? names[i] : ''" });
    const unit = spec.unit || "%";
    const cell = new Bokeh.CustomJSHover({ args: { unit },
      code: "if (value === null || Number.isNaN(value)) return 'no snapshot';" +
            "const a = Math.abs(value), d = a >= 100 ? 0 : Math.max(0, 2 - Math.floor(Math.log10(a || 1)));" +
            "return value.toLocaleString('en-US', {maximumFractionDigits: d}) + ' ' + unit" });
    const xTip = datetime ? ["time", "$x{%F %T}"] : ["step", "$x{0,0}"];
    p.add_tools(new Bokeh.HoverTool({ tooltips: [["", "$y{row}"], xTip, [spec.value_label || "mean", "@image{cell}"]],
                                      formatters: { "$y": rowName, "@image": cell, ...(datetime ? { "$x": "datetime" } : {}) } }));
    p.add_layout(new Bokeh.ColorBar({ color_mapper: new Bokeh.LinearColorMapper({ palette: mapper.palette, low, high }),
                                      width: 10, title: unit }), "right");
    return p;
  }

  // ---- bars, histograms, pies, boxes ----------------------------------------------------------------------
  function bars(spec, ctx) {
    const cats = spec.categories || [];
    const series = spec.series || [], points = spec.points || [];
    const tips = spec.tips || {};
    const width = spec.width ? { width: spec.width, sizing_mode: "fixed" } : {};
    const p = fig(spec, { x_range: new Bokeh.FactorRange({ factors: cats }), y_axis_label: spec.y_label || null,
                          tools: "xpan,xwheel_zoom,reset,save", toolbar_location: "below", ...width });
    plainY(p);
    const cols = colours(series.map(s => s.name), spec.colors);
    const hi = new Set(spec.highlight || []);
    const items = [], main = [];
    const bottom = new Float64Array(cats.length);
    series.forEach((s, i) => {
      const v = nums(s.values);
      const data = { x: cats, top: v, value: v, name: cats.map(() => s.name), ...tips };
      if (spec.stacked) { data.bottom = Float64Array.from(bottom); data.top = v.map((y, k) => bottom[k] + (y || 0)); data.top.forEach((y, k) => { bottom[k] = y; }); }
      data.color = cats.map(c => (hi.has(c) ? get("highlight_colour", "#d62728") : s.color || (series.length > 1 ? cols[s.name] : get("plain_colour", "#4c9be8"))));
      const src = ctx.source(`bar:${i}`, data);
      const r = p.vbar({ x: { field: "x" }, top: { field: "top" }, bottom: spec.stacked ? { field: "bottom" } : 0, width: 0.7,
                         source: src, fill_color: { field: "color" }, line_color: null, fill_alpha: 0.85 });
      main.push(r); items.push([s.name, [r]]); ctx.named(s.name, series.length > 1 ? cols[s.name] : get("plain_colour", "#4c9be8"));
      ctx.count(cats.length);
    });
    points.forEach((s, i) => {
      const c = s.color || palette()[(i + 1) % palette().length];
      const src = ctx.source(`point:${i}`, { x: cats, y: nums(s.values) });
      const r = p.scatter({ x: { field: "x" }, y: { field: "y" }, source: src, marker: s.marker || "diamond", size: 8,
                            fill_color: c, line_color: c });
      items.push([s.name, [r]]); ctx.named(s.name, c);
    });
    const tipRows = [["", "@x"]];
    if (series.length > 1 || !Object.keys(tips).length) tipRows.push([series.length > 1 ? "@name" : (spec.y_label || "value"), "@value{0,0.[00]}"]);
    for (const k of Object.keys(tips)) tipRows.push([k, `@{${k}}{0,0.0}`]);
    if (main.length) p.add_tools(hover(main, tipRows));
    p.y_range = new Bokeh.DataRange1d({ start: 0 });
    p.xgrid.visible = false;
    if (cats.length > 6) p.xaxis.major_label_orientation = cats.length > 16 ? Math.PI / 4 : 0.6;
    if (items.length > 1) legend(p, items, "right");
    return p;
  }

  function histogram(spec, ctx) {
    const series = spec.series || [];
    const xr = spec.x_range ? { x_range: new Bokeh.Range1d({ start: spec.x_range[0], end: spec.x_range[1] }) } : {};
    const p = fig({ height: spec.height || 300, title: spec.title },
                  { tools: PLAIN_TOOLS, x_axis_label: spec.x_label || null, y_axis_label: spec.y_label || null,
                    x_axis_type: spec.log_x ? "log" : "linear", ...xr });
    const cols = colours(series.map(s => s.name), spec.colors);
    const items = [], quads = [], ticks = [];
    series.forEach((s, i) => {
      const src = ctx.source(`hist:${i}`, { left: nums(s.left), right: nums(s.right), top: nums(s.top),
                                            name: s.left.map(() => s.name) });
      const r = p.quad({ left: { field: "left" }, right: { field: "right" }, top: { field: "top" }, bottom: 0,
                         source: src, fill_color: cols[s.name], fill_alpha: 0.5, line_color: cols[s.name], line_alpha: 0.8 });
      quads.push(r); items.push([s.name, [r]]); ctx.named(s.name, cols[s.name]); ctx.count(s.left.length);
    });
    (spec.markers || []).forEach((m, i) => {
      const c = get("highlight_colour", "#d62728");
      const src = ctx.source(`hmark:${i}`, { x: nums(m.x), y: m.x.map(() => 0), text: m.text, name: m.x.map(() => m.name) });
      const r = p.scatter({ x: { field: "x" }, y: { field: "y" }, source: src, marker: "triangle", size: 9, fill_color: c, line_color: c });
      ticks.push(r); items.push([m.name, [r]]); ctx.named(m.name, c);
    });
    const fmt = spec.share ? "@top{0.0%}" : "@top{0,0.[00]}";
    p.add_tools(hover(quads, [["", "@name"], ["from", "@left{0,0.[000]}"], ["to", "@right{0,0.[000]}"], [spec.y_label || "count", fmt]]));
    if (ticks.length) p.add_tools(hover(ticks, [["", "@name"], [spec.marker_label || "value", "@text"], ["at", "@x{0,0.[000]}"]]));
    p.y_range = new Bokeh.DataRange1d({ start: 0 });
    if (spec.share) p.yaxis.formatter = new Bokeh.NumeralTickFormatter({ format: "0 %" }); else plainY(p);
    if (items.length > 1) legend(p, items, "right");
    return p;
  }

  function pie(spec, ctx) {
    const slices = (spec.slices || []).filter(s => s.value > 0);
    const total = slices.reduce((a, s) => a + s.value, 0) || 1;
    const cols = colours(slices.map(s => s.label), spec.colors);
    const size = spec.size || 240;
    const p = fig({ title: spec.title }, { frame_width: size, frame_height: size, sizing_mode: "fixed", width: null, height: null,
                                           x_range: new Bokeh.Range1d({ start: -1.05, end: 1.05 }),
                                           y_range: new Bokeh.Range1d({ start: -1.05, end: 1.05 }),
                                           tools: "pan,wheel_zoom,reset,save", toolbar_location: "below" });
    let start = Math.PI / 2;  // clockwise from twelve o'clock, as pies are read
    const items = [], rs = [];
    slices.forEach((s, i) => {
      const angle = 2 * Math.PI * s.value / total;
      const c = s.color || cols[s.label];
      const src = ctx.source(`slice:${i}`, { label: [s.label], value: [s.value], share: [100 * s.value / total],
                                             start: [start - angle], end: [start] });
      const r = p.wedge({ x: 0, y: 0, radius: 1, start_angle: { field: "start" }, end_angle: { field: "end" }, source: src,
                          fill_color: c, line_color: "white", line_width: 1.5 });
      start -= angle;
      rs.push(r); items.push([s.label.length > 38 ? s.label.slice(0, 37) + "…" : s.label, [r]]); ctx.named(s.label, c);
    });
    ctx.count(slices.length);
    const tips = [["", "@label"], ["share", "@share{0.0} %"]];
    if (spec.unit) tips.push([spec.unit, "@value{0,0.[00]}"]);
    p.add_tools(hover(rs, tips));
    legend(p, items, "right", { spacing: 2 });
    p.axis.visible = false;
    p.grid.visible = false;
    return p;
  }

  function box(spec, ctx) {
    const cats = spec.categories || [];
    const col = k => nums(spec[k] || cats.map(() => null));
    const data = { label: cats };
    for (const k of ["lower", "p25", "p50", "p75", "upper", "p95", "max"]) data[k] = col(k);
    const lo = Math.min(...data.lower.filter(Number.isFinite)), hi = Math.max(...data.upper.filter(Number.isFinite));
    const pad = Math.max((hi - lo) * 0.06, 0.5);
    const p = fig({ height: spec.height || 300, title: spec.title },
                  { x_range: new Bokeh.FactorRange({ factors: cats }), tools: PLAIN_TOOLS, y_axis_label: spec.y_label || null,
                    y_range: new Bokeh.Range1d({ start: lo - pad, end: hi + pad }) });
    const src = ctx.source("box", data);
    p.segment({ x0: { field: "label" }, x1: { field: "label" }, y0: { field: "lower" }, y1: { field: "upper" }, source: src, line_color: "black" });
    p.rect({ x: { field: "label" }, y: { field: "lower" }, width: 0.3, height: 0.01, height_units: "screen", source: src, line_color: "black" });
    p.rect({ x: { field: "label" }, y: { field: "upper" }, width: 0.3, height: 0.01, height_units: "screen", source: src, line_color: "black" });
    const heat = get("heat_palette", ["#440154", "#fde725"]);
    const up = p.vbar({ x: { field: "label" }, width: 0.7, top: { field: "p75" }, bottom: { field: "p50" }, source: src,
                        fill_color: heat[heat.length - 1], line_color: "black" });
    const down = p.vbar({ x: { field: "label" }, width: 0.7, top: { field: "p50" }, bottom: { field: "p25" }, source: src,
                          fill_color: heat[0], line_color: "black" });
    p.add_tools(hover([up, down], [["", "@label"], ["upper whisker", "@upper{0,0.0}"], ["p95", "@p95{0,0.0}"],
                                   ["p75", "@p75{0,0.0}"], ["median", "@p50{0,0.0}"], ["p25", "@p25{0,0.0}"],
                                   ["lower whisker", "@lower{0,0.0}"]]));
    ctx.count(cats.length);
    p.xgrid.visible = false;
    plainY(p);
    return p;
  }

  function grid(spec, ctx) {
    const kids = (spec.children || []).filter(c => !empty(c));
    const models = kids.map(c => build(c, ctx));
    if (spec.share_x) {
      const ranges = models.map(m => m.x_range).filter(Boolean);
      if (ranges.length > 1) { ctx.xRange = ranges[0]; syncRanges(ranges, null); }
    }
    const ncols = spec.ncols || models.length || 1;
    if (kids.every(c => c.kind === "pie")) return new Bokeh.Row({ children: models });
    const rows = [];
    for (let i = 0; i < models.length; i += ncols) rows.push(models.slice(i, i + ncols));
    return Bokeh.Plotting.gridplot(rows, { merge_tools: false, toolbar_location: "right", sizing_mode: "stretch_width" });
  }

  const BUILDERS = { time, heatmap: (s, c) => heat(s, c, false), step_heatmap: (s, c) => heat(s, c, true),
                     bars, histogram, pie, box, grid };

  function empty(spec) {
    switch (spec.kind) {
      case "time": return !(spec.panels || []).some(p => p.lines.some(l => l.x.length)) && !(spec.tracks || []).length
                          && !(spec.flags || []).length;
      case "heatmap": case "step_heatmap": return !(spec.rows || []).length || !(spec.values[0] || []).length;
      case "bars": return !(spec.categories || []).length;
      case "histogram": return !(spec.series || []).some(s => s.left.length);
      case "pie": return (spec.slices || []).filter(s => s.value > 0).length < 2;
      case "box": return !(spec.categories || []).length;
      case "grid": return (spec.children || []).every(empty);
      default: return false;  // an unknown kind is an error (one line saying so), not "nothing to draw"
    }
  }
  function sentence(spec) {
    if (spec.kind === "pie") {
      const one = (spec.slices || []).filter(s => s.value > 0);
      if (one.length === 1) {
        const s = one[0];
        return `${spec.title ? spec.title + ": " : ""}all of it ${s.label}` + (spec.unit ? ` (${number(s.value)} ${spec.unit})` : "") + ".";
      }
    }
    return spec.na || `not applicable: ${spec.title || spec.kind} has no data`;
  }

  function build(spec, ctx) {
    const make = BUILDERS[spec.kind];
    if (!make) throw new Error(`unknown chart kind ${spec.kind}`);
    const outer = building;
    building = ctx;
    try { return make(spec, ctx); } finally { building = outer; }
  }

  function note(el, text, cls) {
    el.replaceChildren();
    const p = document.createElement("p");
    p.className = cls;
    p.textContent = text;  // text only: a run's names never become markup
    el.appendChild(p);
  }

  const drawnIn = new WeakMap();  // element -> its handle: a second render into it removes the first view

  function render(el, spec) {
    const before = drawnIn.get(el);
    if (before && before.view) { try { before.view.remove(); } catch (err) { /* already gone */ } before.view = null; }
    const handle = { el, spec, view: null, xRange: null, ready: Promise.resolve(null), sources: new Map(),
                     update: s => update(handle, s) };
    drawnIn.set(el, handle);
    el.dataset.points = "0";
    el.dataset.series = "{}";
    if (empty(spec)) {
      note(el, sentence(spec), "na");
      if (spec.kind === "pie") for (const s of (spec.slices || []).filter(s => s.value > 0)) {
        el.dataset.series = JSON.stringify({ [s.label]: s.color || colours([s.label], spec.colors)[s.label] });
      }
      return handle;
    }
    try {
      const ctx = new Ctx();
      ctx.el = el;
      const model = build(spec, ctx);
      el.replaceChildren();
      el.dataset.points = String(ctx.points);
      el.dataset.series = JSON.stringify(ctx.series);
      handle.sources = ctx.sources;
      handle.xRange = ctx.xRange;
      handle.model = model;
      for (const p of ctx.figures) {  // the user zoomed or panned (kept through a redraw) or reset
        p.on_event("rangesupdate", () => { handle.moved = true; });
        p.on_event("reset", () => { handle.moved = false; });
      }
      handle.ready = Bokeh.Plotting.show(model, el).then(view => { handle.view = view; return view; }).catch(err => {
        note(el, `This chart could not be drawn (${err && err.name || "error"}).`, "na");
        console.warn("stallwatch: a chart failed to draw", err);
        return null;
      });
    } catch (err) {
      note(el, `This chart could not be drawn (${err && err.name || "error"}).`, "na");
      console.warn("stallwatch: a chart failed to draw", err);
    }
    return handle;
  }

  // New data in place when the shape is the same (the same sources), else a redraw keeping the x range.
  function update(handle, spec) {
    const ctx = new Ctx();
    ctx.el = handle.el;
    let model = null;
    if (!empty(spec)) {
      try { model = build(spec, ctx); } catch (err) { console.warn("stallwatch: a chart failed to update", err); return handle; }
    }
    const same = model && handle.view && ctx.sources.size === handle.sources.size &&
                 [...ctx.sources.keys()].every(k => handle.sources.has(k));
    handle.spec = spec;
    if (same) {
      for (const [k, src] of ctx.sources) handle.sources.get(k).data = src.data;
      handle.el.dataset.points = String(ctx.points);
      handle.el.dataset.series = JSON.stringify(ctx.series);
      return handle;
    }
    const keep = handle.xRange ? [handle.xRange.start, handle.xRange.end] : null;
    if (handle.view) handle.view.remove();
    handle.view = null;
    const fresh = render(handle.el, spec);
    drawnIn.set(handle.el, handle);
    Object.assign(handle, { sources: fresh.sources, xRange: fresh.xRange, model: fresh.model, ready: fresh.ready });
    fresh.ready.then(view => { handle.view = view; if (keep && handle.xRange && handle.moved) { handle.xRange.start = keep[0]; handle.xRange.end = keep[1]; } });
    return handle;
  }

  // ---- linked time axes -----------------------------------------------------------------------------------
  function syncRanges(ranges, settled) {
    let busy = false, timer = null;
    for (const r of ranges) {
      const moved = () => {
        if (busy) return;
        busy = true;
        try { for (const o of ranges) if (o !== r) { o.setv({ start: r.start, end: r.end }); } } finally { busy = false; }
        if (settled) { clearTimeout(timer); timer = setTimeout(() => settled(r.start, r.end), 250); }
      };
      r.properties.start.change.connect(moved);
      r.properties.end.change.connect(moved);
    }
  }
  function linkX(handles, onRangeSettled) {
    const live = handles.filter(h => h && h.xRange);
    for (const h of live) {
      const r = h.xRange;
      const mark = () => { h.moved = true; };
      r.properties.start.change.connect(mark);
    }
    syncRanges(live.map(h => h.xRange), onRangeSettled || null);
  }
  function onBrush(el, cb) {
    if (!brushes.has(el)) brushes.set(el, []);
    brushes.get(el).push(cb);
  }

  return { setCatalogue, setOptions, render, linkX, onBrush, colour, colours, number };
})();

if (typeof window !== "undefined") window.Draw = Draw;
