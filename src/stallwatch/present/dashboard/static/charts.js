// stallwatch dashboard charts: plain canvas, no dependencies. Time charts share one x range (synced zoom and
// pan: wheel zooms, drag pans, shift-drag or a brush chart's drag selects an interval). Values arrive as
// min / max / mean per time bucket: the band keeps peaks visible at every zoom.
"use strict";

const Charts = (() => {
  // Colours, labels and number formats come from the catalogue (catalogue.js), the report's own.
  const PAD = { l: 48, r: 12, t: 22, b: 22 };

  function fmtTime(us, spanUs) {
    const d = new Date(us / 1000);
    const hh = String(d.getUTCHours()).padStart(2, "0"), mm = String(d.getUTCMinutes()).padStart(2, "0");
    const ss = String(d.getUTCSeconds()).padStart(2, "0");
    return spanUs < 120e6 ? `${hh}:${mm}:${ss}` : `${hh}:${mm}`;
  }

  function canvasIn(el, height) {
    el.textContent = "";
    const c = document.createElement("canvas");
    c.style.height = height + "px";
    el.appendChild(c);
    const tip = document.createElement("div");
    tip.className = "tooltip";
    el.appendChild(tip);
    return [c, tip];
  }

  function sizeCanvas(c) {
    const r = window.devicePixelRatio || 1, w = c.clientWidth || 600, h = c.clientHeight || 150;
    if (c.width !== Math.round(w * r) || c.height !== Math.round(h * r)) { c.width = Math.round(w * r); c.height = Math.round(h * r); }
    const ctx = c.getContext("2d");
    ctx.setTransform(r, 0, 0, r, 0, 0);
    return [ctx, w, h];
  }

  // One x range for a group of time charts.
  class Sync {
    constructor(onSettle) { this.charts = []; this.x0 = null; this.x1 = null; this.base = null; this.onSettle = onSettle; this.timer = null; }
    add(chart) { this.charts.push(chart); chart.sync = this; }
    set(x0, x1, settle = true) {
      this.x0 = x0; this.x1 = x1;
      for (const c of this.charts) c.draw();
      if (settle && this.onSettle) { clearTimeout(this.timer); this.timer = setTimeout(() => this.onSettle(x0, x1), 250); }
    }
    clear() { this.charts = []; }
  }

  class TimeChart {
    constructor(el, opts) {
      this.el = el; this.opts = Object.assign({ height: 150, percent: false, title: "", unit: "" }, opts);
      [this.canvas, this.tip] = canvasIn(el, this.opts.height);
      this.data = { ts: [], lines: [], bands: [] };
      this.sync = null; this.brush = null; this.drag = null;
      this._events();
    }
    setData(data) {
      this.data = data;
      const n = data.lines.reduce((a, l) => a + l.values.filter(v => v !== null).length, 0);
      this.el.dataset.points = String(n);
      this.draw();
    }
    range() {
      const ts = this.data.ts, base = this.sync && this.sync.base;  // unzoomed: the group's common extent
      const x0 = this.sync && this.sync.x0 !== null ? this.sync.x0 : base ? base[0] : (ts.length ? ts[0] : 0);
      const x1 = this.sync && this.sync.x1 !== null ? this.sync.x1 : base ? base[1] : (ts.length ? ts[ts.length - 1] : 1);
      return [x0, Math.max(x1, x0 + 1)];
    }
    yMax() {
      if (this.opts.percent) return 100;
      let m = 0;
      for (const l of this.data.lines) for (const v of (l.hi || l.values)) if (v !== null && v > m) m = v;
      for (const b of this.data.bands) for (const v of b.hi) if (v !== null && v > m) m = v;
      return niceMax(m > 0 ? m : 1);
    }
    draw() {
      const [ctx, w, h] = sizeCanvas(this.canvas);
      const [x0, x1] = this.range();
      this.el.dataset.x0 = String(Math.round(x0)); this.el.dataset.x1 = String(Math.round(x1));
      const ym = this.yMax(), pw = w - PAD.l - PAD.r, ph = h - PAD.t - PAD.b;
      const X = t => PAD.l + (t - x0) / (x1 - x0) * pw, Y = v => PAD.t + ph - v / ym * ph;
      ctx.clearRect(0, 0, w, h);
      ctx.fillStyle = "#1d2330"; ctx.font = "600 12px system-ui"; ctx.fillText(this.opts.title, PAD.l, 14);
      ctx.strokeStyle = "#e6e9ef"; ctx.fillStyle = "#6b7385"; ctx.font = "11px system-ui"; ctx.lineWidth = 1;
      for (let i = 0; i <= 4; i++) {
        const v = ym * i / 4, y = Y(v);
        ctx.beginPath(); ctx.moveTo(PAD.l, y); ctx.lineTo(w - PAD.r, y); ctx.stroke();
        ctx.fillText(Cat.number(v), 4, y + 4);
      }
      const label = ctx.measureText(fmtTime(x0, x1 - x0)).width + 12;  // as many labels as fit side by side
      const nx = Math.max(1, Math.min(5, Math.floor(pw / label)));
      for (let i = 0; i <= nx; i++) {
        const t = x0 + (x1 - x0) * i / nx;
        ctx.fillText(fmtTime(t, x1 - x0), Math.max(0, Math.min(X(t) - label / 2 + 6, w - label)), h - 6);
      }
      ctx.save(); ctx.beginPath(); ctx.rect(PAD.l, PAD.t, pw, ph); ctx.clip();
      const ts = this.data.ts;
      for (const b of this.data.bands) {  // min-max band
        ctx.fillStyle = b.color; ctx.globalAlpha = 0.18; ctx.beginPath();
        let open = false; const back = [];
        for (let i = 0; i < ts.length; i++) {
          if (b.lo[i] === null || b.hi[i] === null) { if (open) { close(); } continue; }
          if (!open) { ctx.moveTo(X(ts[i]), Y(b.hi[i])); open = true; } else ctx.lineTo(X(ts[i]), Y(b.hi[i]));
          back.push([X(ts[i]), Y(b.lo[i])]);
        }
        if (open) close();
        function close() { for (let j = back.length - 1; j >= 0; j--) ctx.lineTo(back[j][0], back[j][1]); ctx.closePath(); ctx.fill(); ctx.beginPath(); back.length = 0; open = false; }
        ctx.globalAlpha = 1;
      }
      for (const l of this.data.lines) {
        ctx.strokeStyle = l.color; ctx.lineWidth = l.width || 1.5; ctx.beginPath();
        let pen = false;
        for (let i = 0; i < ts.length; i++) {
          const v = l.values[i];
          if (v === null || v === undefined) { pen = false; continue; }
          if (l.hi && l.lo && l.hi[i] !== null && l.hi[i] !== l.lo[i]) {  // peaks: a vertical stroke per bucket
            if (pen) ctx.lineTo(X(ts[i]), Y(v));
            ctx.moveTo(X(ts[i]), Y(l.lo[i])); ctx.lineTo(X(ts[i]), Y(l.hi[i])); ctx.moveTo(X(ts[i]), Y(v)); pen = true;
            continue;
          }
          if (!pen) { ctx.moveTo(X(ts[i]), Y(v)); pen = true; } else ctx.lineTo(X(ts[i]), Y(v));
        }
        ctx.stroke();
      }
      for (const s of (this.data.spans || [])) {
        ctx.fillStyle = s.color || "rgba(179,38,30,.12)"; ctx.fillRect(X(s.start), PAD.t, Math.max(X(s.end) - X(s.start), 2), ph);
      }
      if (this.brush) { ctx.fillStyle = "rgba(43,95,168,.18)"; ctx.fillRect(X(this.brush[0]), PAD.t, X(this.brush[1]) - X(this.brush[0]), ph); }
      ctx.restore();
      let lx = PAD.l + ctx.measureText(this.opts.title).width + 90;
      for (const l of this.data.lines) {
        ctx.fillStyle = l.color; ctx.fillRect(lx, 6, 10, 3); ctx.fillStyle = "#3a4458"; ctx.fillText(l.name, lx + 14, 12);
        lx += ctx.measureText(l.name).width + 28; if (lx > w - 60) break;
      }
      this._X = X; this._x = [x0, x1, pw];
    }
    timeAt(px) { const [x0, x1, pw] = this._x; return x0 + (px - PAD.l) / pw * (x1 - x0); }
    _events() {
      const c = this.canvas;
      c.addEventListener("wheel", e => {
        if (!this.sync) return; e.preventDefault();
        const [x0, x1] = this.range(), at = this.timeAt(e.offsetX), k = e.deltaY > 0 ? 1.25 : 0.8;
        this.sync.set(at - (at - x0) * k, at + (x1 - at) * k);
      }, { passive: false });
      c.addEventListener("mousedown", e => {
        this.drag = { x: e.offsetX, range: this.range(), brush: e.shiftKey || this.opts.brushOnDrag };
        if (this.drag.brush) this.brush = [this.timeAt(e.offsetX), this.timeAt(e.offsetX)];
      });
      c.addEventListener("mousemove", e => {
        if (this.drag) {
          if (this.drag.brush) { const a = this.timeAt(this.drag.x), b = this.timeAt(e.offsetX); this.brush = [Math.min(a, b), Math.max(a, b)]; this.draw(); }
          else if (this.sync) {
            const [x0, x1] = this.drag.range, dt = (e.offsetX - this.drag.x) / this._x[2] * (x1 - x0);
            this.sync.set(x0 - dt, x1 - dt);
          }
          return;
        }
        this._tip(e);
      });
      const end = () => {
        if (this.drag && this.drag.brush && this.brush && this.opts.onBrush && this.brush[1] - this.brush[0] > 0) this.opts.onBrush(this.brush[0], this.brush[1]);
        this.drag = null;
      };
      c.addEventListener("mouseup", end);
      c.addEventListener("mouseleave", () => { end(); this.tip.style.display = "none"; });
    }
    _tip(e) {
      const ts = this.data.ts; if (!ts.length || !this._X) return;
      const t = this.timeAt(e.offsetX);
      let lo = 0, hi = ts.length - 1;
      while (lo < hi) { const m = (lo + hi) >> 1; if (ts[m] < t) lo = m + 1; else hi = m; }
      const lines = [fmtTime(ts[lo], 0)];
      for (const l of this.data.lines) { const v = l.values[lo]; if (v !== null && v !== undefined) lines.push(`${l.name}: ${Cat.fmt(v * (this.opts.scale || 1), this.opts.unit)}`); }
      this.tip.textContent = lines.join("\n");
      this.tip.style.left = (e.offsetX + 12) + "px"; this.tip.style.top = (e.offsetY + 8) + "px"; this.tip.style.display = "block";
    }
  }

  // One track per rank of its phase blocks on the shared time axis (Perfetto's layout): a step is the track's
  // light background, its phases coloured blocks in it; zoomed out (`aggregated`), each time bucket is a column
  // split by the share of its time each phase took. Zooms, pans and brushes with the other time charts.
  const TRACK_H = 18, TRACK_GAP = 4;
  class TrackChart extends TimeChart {
    constructor(el, opts) { super(el, Object.assign({ height: 60 }, opts)); this.tracks = null; }
    setTracks(doc, x0, x1) {
      this.tracks = doc;
      const n = Math.max(doc.ranks.length, 1);
      this.canvas.style.height = (PAD.t + PAD.b + n * (TRACK_H + TRACK_GAP) + 4) + "px";
      this.data = { ts: [x0, x1], lines: [], bands: [] };
      let blocks = 0;
      if (!doc.aggregated) for (const rows of Object.values(doc.blocks || {})) blocks += rows.filter(b => b[0] !== "step").length;
      this.el.dataset.ranks = String(doc.ranks.length);
      this.el.dataset.mode = doc.aggregated ? "buckets" : "blocks";
      this.el.dataset.blocks = String(doc.aggregated ? doc.total_blocks : blocks);
      this.draw();
    }
    draw() {
      const [ctx, w, h] = sizeCanvas(this.canvas);
      const [x0, x1] = this.range();
      this.el.dataset.x0 = String(Math.round(x0)); this.el.dataset.x1 = String(Math.round(x1));
      const pw = w - PAD.l - PAD.r, X = t => PAD.l + (t - x0) / (x1 - x0) * pw;
      ctx.clearRect(0, 0, w, h);
      ctx.fillStyle = "#1d2330"; ctx.font = "600 12px system-ui"; ctx.fillText(this.opts.title, PAD.l, 14);
      const doc = this.tracks;
      this._X = X; this._x = [x0, x1, pw];
      if (!doc) return;
      ctx.font = "11px system-ui";
      const label = ctx.measureText(fmtTime(x0, x1 - x0)).width + 12, nx = Math.max(1, Math.min(5, Math.floor(pw / label)));
      ctx.fillStyle = "#6b7385";
      for (let i = 0; i <= nx; i++) { const t = x0 + (x1 - x0) * i / nx; ctx.fillText(fmtTime(t, x1 - x0), Math.max(0, Math.min(X(t) - label / 2 + 6, w - label)), h - 6); }
      const kinds = new Set();
      doc.ranks.forEach((rank, i) => {
        const y = PAD.t + i * (TRACK_H + TRACK_GAP);
        ctx.fillStyle = "#3a4458"; ctx.fillText(`rank ${rank}`, 2, y + TRACK_H - 5);
        ctx.save(); ctx.beginPath(); ctx.rect(PAD.l, y, pw, TRACK_H); ctx.clip();
        ctx.fillStyle = "#f4f6f9"; ctx.fillRect(PAD.l, y, pw, TRACK_H);
        if (doc.aggregated) {
          const per = doc.shares[String(rank)] || {};
          const bw = doc.bucket_us, n = Math.max(0, ...Object.values(per).map(v => v.length));
          for (let j = 0; j < n; j++) {
            const a = X(doc.bucket_start_us + j * bw), b = X(doc.bucket_start_us + (j + 1) * bw);
            if (b < PAD.l || a > w) continue;
            let yy = y + TRACK_H;
            for (const [k, v] of Object.entries(per)) {
              const hh = (v[j] || 0) * TRACK_H; if (hh <= 0) continue;
              kinds.add(k); ctx.fillStyle = Cat.colour(k) || "#999"; ctx.fillRect(a, yy - hh, Math.max(b - a, 1), hh); yy -= hh;
            }
          }
        } else {
          let odd = false;
          for (const [k, s, e] of (doc.blocks[String(rank)] || [])) {
            if (e < x0 || s > x1) { if (k === "step") odd = !odd; continue; }
            if (k === "step") { ctx.fillStyle = odd ? "#e3e7ef" : "#eceff5"; odd = !odd; ctx.fillRect(X(s), y, Math.max(X(e) - X(s), 1), TRACK_H); continue; }
            kinds.add(k); ctx.fillStyle = Cat.colour(k) || "#999"; ctx.fillRect(X(s), y + 2, Math.max(X(e) - X(s), 1), TRACK_H - 4);
          }
        }
        if (this.brush) { ctx.fillStyle = "rgba(43,95,168,.18)"; ctx.fillRect(X(this.brush[0]), y, X(this.brush[1]) - X(this.brush[0]), TRACK_H); }
        ctx.restore();
      });
      let lx = PAD.l + ctx.measureText(this.opts.title).width + 90;
      ctx.font = "11px system-ui";
      for (const k of kinds) {
        const name = Cat.label(k); ctx.fillStyle = Cat.colour(k) || "#999"; ctx.fillRect(lx, 5, 10, 8); ctx.fillStyle = "#3a4458"; ctx.fillText(name, lx + 14, 13);
        lx += ctx.measureText(name).width + 28; if (lx > w - 60) break;
      }
      this.el.dataset.kinds = [...kinds].join(",");
    }
    _tip(e) {
      const doc = this.tracks; if (!doc || !this._x) return;
      const i = Math.floor((e.offsetY - PAD.t) / (TRACK_H + TRACK_GAP)), rank = doc.ranks[i], t = this.timeAt(e.offsetX);
      if (rank === undefined) { this.tip.style.display = "none"; return; }
      let text = `rank ${rank} · ${fmtTime(t, 0)}`;
      if (doc.aggregated) {
        const per = doc.shares[String(rank)] || {}, j = Math.floor((t - doc.bucket_start_us) / doc.bucket_us);
        for (const [k, v] of Object.entries(per)) if (v[j]) text += `\n${Cat.label(k)}: ${Cat.fmt(v[j] * 100, "%")}`;
      } else {
        for (const [k, s, en, step, mode] of (doc.blocks[String(rank)] || [])) {
          if (s <= t && t <= en) text += `\n${k === "step" ? `${mode} step ${step ?? ""}` : Cat.label(k)}: ${Cat.fmt((en - s) / 1000, "ms")}`;
        }
      }
      this.tip.textContent = text;
      this.tip.style.left = (e.offsetX + 12) + "px"; this.tip.style.top = (e.offsetY + 8) + "px"; this.tip.style.display = "block";
    }
  }

  // Horizontal stacked bars, one per row (a rank): its parts by key, the row's name on the left and its total
  // on the right; `highlight` rows named in red.
  function hbars(el, { rows, keys, title, unit, highlight }) {
    const colours = Cat.colours(keys), rh = 18;
    const [c, tip] = canvasIn(el, 34 + rows.length * rh + 18);
    const [ctx, w, h] = sizeCanvas(c);
    const left = 96, right = 80, top = 22, pw = w - left - right;
    let m = 0; for (const r of rows) { const s = keys.reduce((a, k) => a + (r.parts[k] || 0), 0); if (s > m) m = s; }
    m = m || 1;
    ctx.fillStyle = "#1d2330"; ctx.font = "600 12px system-ui"; ctx.fillText(title || "", left, 14);
    ctx.font = "11px system-ui";
    rows.forEach((r, i) => {
      const y = top + i * rh; let x = left, total = 0;
      ctx.fillStyle = highlight && highlight.has(r.name) ? "#b3261e" : "#3a4458"; ctx.fillText(String(r.name).slice(0, 16), 2, y + rh - 6);
      for (const k of keys) { const v = r.parts[k] || 0, ww = v / m * pw; total += v; ctx.fillStyle = colours[k]; ctx.fillRect(x, y + 2, ww, rh - 4); x += ww; }
      ctx.fillStyle = "#3a4458"; ctx.fillText(Cat.fmt(total, unit || "ms"), x + 4, y + rh - 6);
    });
    let lx = left; const ly = top + rows.length * rh + 12;
    keys.forEach(k => { const name = Cat.label(k); ctx.fillStyle = colours[k]; ctx.fillRect(lx, ly - 8, 10, 8); ctx.fillStyle = "#3a4458"; ctx.fillText(name, lx + 13, ly); lx += ctx.measureText(name).width + 26; });
    el.dataset.bars = String(rows.length);
    el.dataset.colours = JSON.stringify(Object.fromEntries(keys.map(k => [Cat.label(k), colours[k]])));
    c.addEventListener("mousemove", e => {
      const i = Math.floor((e.offsetY - top) / rh), r = rows[i];
      if (!r) { tip.style.display = "none"; return; }
      tip.textContent = [r.name, ...keys.map(k => `${Cat.label(k)}: ${Cat.fmt(r.parts[k] || 0, unit || "ms")}`)].join("\n");
      tip.style.left = (e.offsetX + 12) + "px"; tip.style.top = (e.offsetY + 8) + "px"; tip.style.display = "block";
    });
    c.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  }

  // The top of an axis from 0 to at least `m`: four ticks of a round step (1, 2, 2.5 or 5 × 10^k).
  function niceMax(m) {
    const raw = m / 4, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map(k => k * p).find(s => s >= raw) || 10 * p;
    return step * 4;
  }

  // Rows × columns of values as coloured cells, Viridis as the report's (no data: its grey); a colour bar
  // on the right; `highlight` rows get an outline.
  function heatmap(el, { rows, values, max, title, xLabel, highlight, height, unit }) {
    const h = height || Math.max(80, Math.min(rows.length * 14 + 40, 420));
    const [c, tip] = canvasIn(el, h);
    const [ctx, w] = sizeCanvas(c);
    const left = 90, top = 18, pw = w - left - 70, ph = h - top - 20;
    const cols = values.length ? values[0].length : 0;
    let m = max || 0;
    if (!m) for (const r of values) for (const v of r) if (v !== null && v > m) m = v;
    m = m || 1;
    ctx.fillStyle = "#1d2330"; ctx.font = "600 12px system-ui"; ctx.fillText(title || "", left, 12);
    const cw = pw / Math.max(cols, 1), rh = ph / Math.max(rows.length, 1);
    for (let i = 0; i < rows.length; i++) {
      for (let j = 0; j < cols; j++) {
        const v = values[i][j];
        ctx.fillStyle = Cat.heat(v === null ? null : Math.min(v / m, 1));
        ctx.fillRect(left + j * cw, top + i * rh, Math.ceil(cw), Math.ceil(rh));
      }
      ctx.fillStyle = "#3a4458"; ctx.font = "11px system-ui";
      if (rh >= 9) ctx.fillText(String(rows[i]).slice(0, 14), 2, top + i * rh + rh / 2 + 4);
      if (highlight && highlight.has(rows[i])) { ctx.strokeStyle = "#b3261e"; ctx.lineWidth = 2; ctx.strokeRect(left, top + i * rh, pw, rh); }
    }
    ctx.fillStyle = "#6b7385"; ctx.fillText(xLabel || "", left, h - 4);
    const bx = left + pw + 12, bh = Math.max(ph, 20);  // the colour bar: 0 at the bottom, the top value above
    for (let k = 0; k < bh; k++) { ctx.fillStyle = Cat.heat(1 - k / bh); ctx.fillRect(bx, top + k, 10, 1); }
    ctx.fillStyle = "#3a4458"; ctx.font = "11px system-ui";
    ctx.fillText(Cat.fmt(m, unit || ""), bx + 13, top + 9); ctx.fillText(Cat.fmt(0, unit || ""), bx + 13, top + bh);
    el.dataset.cells = String(rows.length * cols);
    el.dataset.palette = "viridis";
    c.addEventListener("mousemove", e => {
      const j = Math.floor((e.offsetX - left) / cw), i = Math.floor((e.offsetY - top) / rh);
      if (i < 0 || j < 0 || i >= rows.length || j >= cols) { tip.style.display = "none"; return; }
      const v = values[i][j];
      tip.textContent = `${rows[i]} · ${j}: ${v === null ? "no data" : Cat.fmt(v, unit || "")}`;
      tip.style.left = (e.offsetX + 12) + "px"; tip.style.top = (e.offsetY + 8) + "px"; tip.style.display = "block";
    });
    c.addEventListener("mouseleave", () => { tip.style.display = "none"; });
  }

  // Stacked bars: one bar per item, parts by key.
  function stacked(el, { items, keys, title, height, unit }) {
    const colours = Cat.colours(keys);
    const [c] = canvasIn(el, height || 170);
    const [ctx, w, h] = sizeCanvas(c);
    const pw = w - PAD.l - PAD.r, ph = h - PAD.t - PAD.b - 14;
    let m = 0; for (const it of items) { const s = keys.reduce((a, k) => a + (it.parts[k] || 0), 0); if (s > m) m = s; }
    m = m || 1;
    ctx.fillStyle = "#1d2330"; ctx.font = "600 12px system-ui"; ctx.fillText(title || "", PAD.l, 14);
    ctx.font = "11px system-ui"; ctx.fillStyle = "#6b7385";
    ctx.fillText(Cat.fmt(m, unit || "ms"), 4, PAD.t + 8);
    const bw = pw / Math.max(items.length, 1);
    items.forEach((it, i) => {
      let y = PAD.t + ph;
      keys.forEach((k, j) => {
        const v = it.parts[k] || 0, hh = v / m * ph;
        ctx.fillStyle = colours[k]; ctx.fillRect(PAD.l + i * bw + 1, y - hh, Math.max(bw - 2, 1), hh); y -= hh;
      });
      if (items.length <= 40 && i % 5 === 0) { ctx.fillStyle = "#6b7385"; ctx.fillText(String(it.label), PAD.l + i * bw, PAD.t + ph + 12); }
    });
    let lx = PAD.l; keys.forEach(k => { const name = Cat.label(k); ctx.fillStyle = colours[k]; ctx.fillRect(lx, h - 10, 10, 8); ctx.fillStyle = "#3a4458"; ctx.fillText(name, lx + 13, h - 2); lx += ctx.measureText(name).width + 26; });
    el.dataset.colours = JSON.stringify(Object.fromEntries(keys.map(k => [Cat.label(k), colours[k]])));
    el.dataset.bars = String(items.length);
    el.dataset.last = items.length ? String(items[items.length - 1].label) : "";
  }

  // A pie as SVG (text via textContent only).
  function pie(el, parts) {
    el.textContent = "";
    const ns = "http://www.w3.org/2000/svg", total = parts.reduce((a, p) => a + p.value, 0);
    const svg = document.createElementNS(ns, "svg"); svg.setAttribute("viewBox", "0 0 320 140"); svg.setAttribute("width", "320");
    if (!total) { el.textContent = "no steps recorded yet"; return; }
    let a = -Math.PI / 2;
    const colours = Cat.colours(parts.map(p => p.label));  // a phase's own colour, whatever its place
    el.dataset.colours = JSON.stringify(colours);
    parts = parts.filter(p => p.value > 0);
    parts.forEach((p, i) => {
      const da = p.value / total * 2 * Math.PI; if (da <= 0) return;
      const path = document.createElementNS(ns, "path");
      const x0 = 70 + 60 * Math.cos(a), y0 = 70 + 60 * Math.sin(a), x1 = 70 + 60 * Math.cos(a + da), y1 = 70 + 60 * Math.sin(a + da);
      path.setAttribute("d", da >= 2 * Math.PI - 1e-6 ? "M70,10 A60,60 0 1 1 69.99,10 Z" : `M70,70 L${x0},${y0} A60,60 0 ${da > Math.PI ? 1 : 0} 1 ${x1},${y1} Z`);
      path.setAttribute("fill", colours[p.label]);
      const t = document.createElementNS(ns, "title"); t.textContent = `${p.label}: ${Cat.fmt(p.value / total * 100, "%")}`; path.appendChild(t);
      svg.appendChild(path);
      const r = document.createElementNS(ns, "rect"); r.setAttribute("x", "150"); r.setAttribute("y", String(14 + i * 18)); r.setAttribute("width", "10"); r.setAttribute("height", "10"); r.setAttribute("fill", colours[p.label]); svg.appendChild(r);
      const tx = document.createElementNS(ns, "text"); tx.setAttribute("x", "165"); tx.setAttribute("y", String(23 + i * 18)); tx.setAttribute("font-size", "12");
      tx.textContent = `${p.label} ${Cat.fmt(p.value / total * 100, "%")}`; svg.appendChild(tx);
      a += da;
    });
    el.appendChild(svg);
  }

  return { Sync, TimeChart, TrackChart, heatmap, stacked, hbars, pie, fmtTime, niceMax, get PALETTE() { return Cat.palette(); } };
})();
