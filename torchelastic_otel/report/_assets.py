"""The inline style and script of the HTML report (kept in Python strings so the package needs no data files).

The script reads the JSON island ``#report-data`` and draws, per job, the timeline and the metric charts, which
share the timeline's time axis and zoom. The timeline is grouped by node in the page's own ``<details>`` elements:
an axis lane (with the restarts), then per node shown a lane (an SVG: a row for its agent and per rank, bars per
attempt and worker, thin bars for rendezvous and worker spans, marks for failures), drawn only while its
``<details>`` is open (so 1,024 folded nodes cost nothing), and a lane of the healthy nodes' bands. It only
creates elements and sets text and attributes (never ``innerHTML``), so no string from the telemetry can become
markup; it loads nothing.
"""

CSS = r"""
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dee7; --bg:#fff; --panel:#f6f8fb;
  --ok:#3f9b5b; --fail:#d23f3f; --stop:#e3a33b; --attempt:#5677b8; --rdzv:#8e6bbf; --span:#2b8a9a; }
* { box-sizing: border-box; }
body { margin: 0; padding: 20px 28px 40px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  color: var(--fg); background: var(--bg); }
h1 { font-size: 21px; margin: 0 0 2px; }
h2 { font-size: 18px; margin: 18px 0 4px; }
h3 { font-size: 15px; margin: 22px 0 6px; border-bottom: 1px solid var(--line); padding-bottom: 3px; }
code, pre { font: 12.5px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 4px; padding: 8px 10px;
  overflow: auto; max-height: 420px; margin: 6px 0; white-space: pre; }
.meta, .summary, .note, .hint { color: var(--muted); }
.note { font-size: 13px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 13px; color: #fff;
  background: var(--muted); vertical-align: 2px; }
.badge.succeeded { background: var(--ok); } .badge.failed { background: var(--fail); }
.badge.unfinished { background: var(--stop); }
.toolbar { display: flex; gap: 6px; align-items: center; margin: 4px 0 6px; }
.toolbar button { font: inherit; min-width: 30px; padding: 1px 8px; border: 1px solid var(--line);
  background: var(--panel); border-radius: 4px; cursor: pointer; }
.toolbar .hint { margin-left: 8px; font-size: 12.5px; }
.timeline { border: 1px solid var(--line); border-radius: 4px; overflow: hidden; user-select: none; }
.timeline svg { display: block; cursor: grab; }
.timeline.dragging svg { cursor: grabbing; }
.timeline details { border-top: 1px solid var(--line); }
.timeline summary { padding: 3px 8px; font-size: 13px; color: var(--fg); background: var(--panel); }
.timeline details.deviating > summary { color: #9b1c1c; font-weight: 600; background: #fdf0f0; }
.timeline .healthy { border-top: 1px solid var(--line); }
.timeline .band-title { margin: 0; padding: 3px 8px; font-size: 13px; background: #eef7f1; color: var(--fg); }
.timeline ul.bands { margin: 2px 0 4px; padding-left: 26px; font-size: 12.5px; color: var(--muted); }
.timeline > .note { margin: 4px 8px; }
rect.band.ok { fill: var(--ok); } rect.band.stopped { fill: var(--stop); }
p.hosts { margin: 0 0 4px; color: var(--muted); overflow-wrap: anywhere; }
ul.deviating { margin: 4px 0; padding-left: 18px; } ul.deviating > li { margin: 2px 0; }
ul.deviating ul { margin: 0; padding-left: 18px; font-size: 13px; color: var(--muted); overflow-wrap: anywhere; }
.details { min-height: 2.4em; max-height: 160px; white-space: pre-wrap; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; font-size: 12.5px; color: var(--muted); margin: 4px 0; }
.legend .sw { display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: -1px;
  border-radius: 2px; }
.sw.attempt.ok, rect.attempt.ok { fill: var(--attempt); background: var(--attempt); }
.sw.attempt.failed, rect.attempt.failed { fill: var(--fail); background: var(--fail); }
rect.attempt.running { fill: var(--stop); }
.sw.worker.succeeded, rect.worker.succeeded, rect.worker.running, rect.worker.unknown {
  fill: var(--ok); background: var(--ok); }
.sw.worker.failed, rect.worker.failed { fill: var(--fail); background: var(--fail); }
.sw.worker.terminated, rect.worker.terminated, rect.worker.stopped { fill: var(--stop); background: var(--stop); }
rect.worker.root-cause { stroke: #7a0f0f; stroke-width: 2; }
rect.process { fill: #9aa5b8; }
.sw.rdzv, rect.rdzv { fill: var(--rdzv); background: var(--rdzv); }
.sw.span, rect.span { fill: var(--span); background: var(--span); }
rect.span.failed { fill: var(--fail); }
rect.bar, rect.span, rect.rdzv { cursor: pointer; }
rect.row-bg { fill: #fff; } rect.row-bg.odd { fill: #f7f9fc; }
text { font: 12px system-ui, sans-serif; fill: var(--fg); }
text.row-label { font-weight: 600; } text.row-label.rank { font-weight: 400; }
text.row-label.band { fill: #2d6b3f; }
text.bar-label { fill: #fff; font-size: 11px; pointer-events: none; }
text.tick { fill: var(--muted); font-size: 11px; }
line.grid { stroke: #e6eaf0; } line.axis { stroke: #aab3c2; }
.mark line { stroke-width: 2; }
.mark text, text.restart-label { font-weight: 700; font-size: 14px; paint-order: stroke; stroke: #fff;
  stroke-width: 3px; }
.mark.failure line, .mark.failed line { stroke: var(--fail); }
.mark.failure text, .mark.failed text { fill: var(--fail); }
.mark.terminated line { stroke: #a86d0c; } .mark.terminated text { fill: #a86d0c; }
line.restart-line { stroke: #a86d0c; stroke-dasharray: 4 3; stroke-width: 1.5; }
text.restart-label { fill: #a86d0c; font-size: 12px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr)); gap: 12px; }
.chart { border: 1px solid var(--line); border-radius: 4px; padding: 6px 8px; }
.chart h4 { margin: 0 0 2px; font-size: 13px; font-weight: 600; overflow-wrap: anywhere; }
.chart .keys { display: flex; flex-wrap: wrap; gap: 4px 10px; font-size: 11.5px; color: var(--muted); }
.chart .keys i { display: inline-block; width: 14px; height: 3px; margin-right: 4px; vertical-align: 3px; }
.chart polyline { fill: none; stroke-width: 1.8; }
.chart polyline.earlier { stroke-dasharray: 5 3; opacity: .6; }
table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
table.metrics td:nth-child(n+3) { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.metrics td:nth-child(2) { white-space: nowrap; color: var(--muted); }
tr.root-cause td { background: #fdf0f0; }
tr.straggler td, p.missing, p.straggler-line { background: #fdf0f0; }
p.missing, p.straggler-line { border-left: 4px solid var(--fail); padding: 4px 10px; }
table.stragglers td:nth-child(n+4) { text-align: right; font-variant-numeric: tabular-nums; }
table.stalls { width: 100%; table-layout: fixed; } table.stalls td { overflow-wrap: anywhere; }
table.stalls th:nth-child(-n+4) { width: 90px; }
table.failures, table.logs { width: 100%; table-layout: fixed; }
table.failures td, table.logs td { overflow-wrap: anywhere; }
table.failures th:nth-child(-n+2) { width: 72px; } table.failures th:nth-child(3) { width: 190px; }
table.logs th:nth-child(-n+2) { width: 80px; } table.logs th:nth-child(3) { width: 150px; }
.cause { border-left: 4px solid var(--fail); padding: 2px 0 2px 12px; margin: 8px 0; }
.cause .headline { font-weight: 600; color: #9b1c1c; margin: 2px 0; }
details summary { cursor: pointer; color: var(--muted); font-size: 12.5px; }
p.verdict { border-left: 4px solid var(--fail); background: #fdf0f0; padding: 4px 10px; margin: 6px 0; }
p.verdict.healthy { border-color: var(--ok); background: #eef7f1; }
p.verdict.compute-bound { border-color: var(--attempt); background: #eef2fa; }
.goodput { margin: 6px 0 10px; } .goodput .gp-label { font-size: 13px; font-weight: 600; margin-bottom: 2px; }
svg.gp-bar { display: block; border: 1px solid var(--line); border-radius: 3px; background: var(--panel); }
rect.gp { stroke: #fff; stroke-width: 0; }
.gp.productive { fill: var(--ok); background: var(--ok); }
.gp.startup { fill: #9aa5b8; background: #9aa5b8; }
.gp.rendezvous { fill: var(--rdzv); background: var(--rdzv); }
.gp.restart { fill: var(--stop); background: var(--stop); }
.gp.checkpoint_save { fill: var(--attempt); background: var(--attempt); }
.gp.checkpoint_load { fill: #8fa8d8; background: #8fa8d8; }
.gp.lost_progress { fill: var(--fail); background: var(--fail); }
.gp.input_wait { fill: #e0c341; background: #e0c341; }
.gp.stalled { fill: #7a0f0f; background: #7a0f0f; }
table.stragglers td.phase { text-align: right; font-variant-numeric: tabular-nums; }
.problems { margin-top: 24px; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                "#7f7f7f", "#d62728"];
  var LABEL = 150, AXIS = 26, PAD_RIGHT = 12;
  var data = JSON.parse(document.getElementById("report-data").textContent);

  function node(name, attrs, parent, content) {
    var n = document.createElementNS(SVG, name);
    for (var k in attrs) { if (attrs[k] !== null && attrs[k] !== undefined) { n.setAttribute(k, attrs[k]); } }
    if (content !== undefined) { n.textContent = content; }
    if (parent) { parent.appendChild(n); }
    return n;
  }
  function html(name, cls, parent, content) {
    var n = document.createElement(name);
    if (cls) { n.className = cls; }
    if (content !== undefined) { n.textContent = content; }
    if (parent) { parent.appendChild(n); }
    return n;
  }
  function seconds(ms, step) {
    var s = ms / 1000, digits = step >= 1000 ? 0 : step >= 100 ? 1 : step >= 10 ? 2 : 3;
    return s.toFixed(digits) + " s";
  }
  function niceStep(span, n) {
    var raw = span / Math.max(1, n), mag = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
  }
  function number(v) {
    if (v === null || v === undefined) { return ""; }
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) { return v.toExponential(2); }
    return String(Math.round(v * 1000) / 1000);
  }
  function color(rank) { return COLORS[(rank === null || rank === undefined ? 0 : rank) % COLORS.length]; }

  function JobView(job) {
    this.job = job;
    this.section = document.getElementById("job-" + job.index);
    this.box = this.section.querySelector(".timeline");
    this.details = this.section.querySelector(".details");
    this.chartsBox = this.section.querySelector(".charts:not(.training)");
    this.trainingBox = this.section.querySelector(".charts.training");
    this.full = { a: -job.end * 0.01, b: job.end * 1.01 + 1 };
    this.view = { a: this.full.a, b: this.full.b };
    this.bind();
    this.draw();
  }

  JobView.prototype.width = function () { return Math.max(480, this.box.clientWidth || 960); };
  JobView.prototype.x = function (t, w) { return LABEL + (t - this.view.a) / (this.view.b - this.view.a) * w; };
  JobView.prototype.t = function (x, w) { return this.view.a + (x - LABEL) / w * (this.view.b - this.view.a); };

  JobView.prototype.zoom = function (center, factor) {
    var a = center - (center - this.view.a) * factor, b = center + (this.view.b - center) * factor;
    var fullSpan = this.full.b - this.full.a;
    if (b - a < 0.5) { return; }
    if (b - a > fullSpan) { a = this.full.a; b = this.full.b; }
    this.view = { a: a, b: b };
    this.draw();
  };
  JobView.prototype.pan = function (dt) {
    var span = this.view.b - this.view.a, a = this.view.a + dt;
    a = Math.max(this.full.a, Math.min(a, this.full.b - span));
    this.view = { a: a, b: a + span };
    this.draw();
  };
  JobView.prototype.reset = function () { this.view = { a: this.full.a, b: this.full.b }; this.draw(); };

  JobView.prototype.bind = function () {
    var self = this, drag = null;
    this.section.querySelectorAll(".toolbar button").forEach(function (b) {
      b.addEventListener("click", function () {
        var mid = (self.view.a + self.view.b) / 2, z = b.getAttribute("data-zoom");
        if (z === "in") { self.zoom(mid, 0.5); } else if (z === "out") { self.zoom(mid, 2); } else { self.reset(); }
      });
    });
    this.box.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var w = self.width() - LABEL - PAD_RIGHT, rect = self.box.getBoundingClientRect();
      self.zoom(self.t(ev.clientX - rect.left, w), ev.deltaY < 0 ? 0.8 : 1.25);
    }, { passive: false });
    this.box.addEventListener("pointerdown", function (ev) {
      if (!ev.target.closest || !ev.target.closest("svg")) { return; }  // a <summary>: let it fold and unfold
      drag = { x: ev.clientX, moved: false };
      self.box.setPointerCapture(ev.pointerId);
    });
    this.box.querySelectorAll("details").forEach(function (d) {
      d.addEventListener("toggle", function () { self.drawTimeline(); });
    });
    this.box.addEventListener("pointermove", function (ev) {
      if (!drag) { return; }
      var dx = ev.clientX - drag.x;
      if (Math.abs(dx) < 3 && !drag.moved) { return; }
      drag.moved = true;
      self.box.classList.add("dragging");
      var w = self.width() - LABEL - PAD_RIGHT;
      self.pan(-dx / w * (self.view.b - self.view.a));
      drag.x = ev.clientX;
    });
    this.box.addEventListener("pointerup", function (ev) {
      var click = drag && !drag.moved;
      drag = null;
      self.box.classList.remove("dragging");
      if (click) {
        var hit = document.elementFromPoint(ev.clientX, ev.clientY);
        var item = hit && hit.closest ? hit.closest("[data-title]") : null;
        if (item) { self.details.textContent = item.getAttribute("data-title"); }
      }
    });
    this.box.addEventListener("dblclick", function () { self.reset(); });
    window.addEventListener("resize", function () { self.draw(); });
  };

  JobView.prototype.draw = function () {
    this.drawTimeline();
    this.drawCharts();
  };

  JobView.prototype.ticks = function (svg, w, top, bottom, labels) {
    var step = niceStep(this.view.b - this.view.a, Math.max(2, Math.floor(w / 110)));
    for (var t = Math.ceil(this.view.a / step) * step; t <= this.view.b; t += step) {
      var x = this.x(t, w);
      node("line", { "class": "grid", x1: x, x2: x, y1: top, y2: bottom }, svg);
      if (labels) { node("text", { "class": "tick", x: x + 3, y: top - 6 }, svg, seconds(t, step)); }
    }
  };

  JobView.prototype.lanes = function () {
    var self = this, out = [];
    this.box.querySelectorAll(".lane").forEach(function (lane) {
      var details = lane.closest("details");
      if (details && !details.open) { lane.textContent = ""; return; }
      if (lane.classList.contains("axis-lane")) { out.push({ el: lane, axis: true, rows: [] }); }
      else if (lane.classList.contains("band-lane")) { out.push({ el: lane, rows: self.job.bands }); }
      else {
        var group = self.job.groups[+lane.getAttribute("data-group")];
        if (group) { out.push({ el: lane, rows: group.rows }); }
      }
    });
    return out;
  };

  JobView.prototype.drawTimeline = function () {
    var self = this;
    this.svg = null;
    this.lanes().forEach(function (lane) {
      var svg = lane.axis ? self.drawAxis() : self.drawLane(lane.rows);
      lane.el.textContent = "";
      lane.el.appendChild(svg);
      if (!self.svg) { self.svg = svg; }
    });
  };

  JobView.prototype.frame = function (height) {
    var width = this.width(), svg = node("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height,
      "data-view-start": this.view.a.toFixed(3), "data-view-end": this.view.b.toFixed(3) });
    return { svg: svg, width: width, w: width - LABEL - PAD_RIGHT };
  };

  JobView.prototype.drawAxis = function () {
    var self = this, f = this.frame(AXIS), svg = f.svg;
    this.ticks(svg, f.w, AXIS - 4, AXIS, true);
    node("line", { "class": "axis", x1: LABEL, x2: LABEL + f.w, y1: AXIS - 1, y2: AXIS - 1 }, svg);
    (this.job.restarts || []).forEach(function (m) {
      var x = self.x(m.t, f.w);
      if (x < LABEL || x > LABEL + f.w) { return; }
      var g = node("g", { "class": "mark restart", "data-title": m.title }, svg);
      node("line", { "class": "restart-line", x1: x, x2: x, y1: 4, y2: AXIS }, g);
      node("text", { "class": "restart-label", x: x + 4, y: 14 }, g, m.l);
      node("title", {}, g, m.title);
    });
    return svg;
  };

  JobView.prototype.drawLane = function (rows) {
    var self = this, heights = rows.map(function (r) { return r.kind === "rank" ? 24 : 30; });
    var height = heights.reduce(function (s, h) { return s + h; }, 0) + 2;
    var f = this.frame(height), svg = f.svg, width = f.width, w = f.w;
    var clipId = "clip-" + this.job.index + "-" + (this.clips = (this.clips || 0) + 1);
    node("rect", { x: LABEL, y: 0, width: w, height: height }, node("clipPath", { id: clipId }, node("defs", {}, svg)));
    var y = 0, rowsG = node("g", {}, svg);
    rows.forEach(function (row, i) {
      node("rect", { "class": "row-bg" + (i % 2 ? " odd" : ""), x: 0, y: y, width: width, height: heights[i] }, rowsG);
      node("text", { "class": "row-label " + row.kind, x: row.kind === "rank" ? 20 : 8, y: y + heights[i] / 2 + 4 },
           rowsG, row.label);
      y += heights[i];
    });
    this.ticks(svg, w, 0, height, false);
    var plot = node("g", { "clip-path": "url(#" + clipId + ")" }, svg);
    (this.job.restarts || []).forEach(function (m) {
      var x = self.x(m.t, w);
      node("line", { "class": "restart-line", x1: x, x2: x, y1: 0, y2: height }, plot);
    });
    y = 0;
    rows.forEach(function (row, i) {
      self.drawRow(plot, row, y, heights[i], w);
      y += heights[i];
    });
    return svg;
  };

  JobView.prototype.drawRow = function (g, row, y, h, w) {
    var self = this;
    row.bars.forEach(function (b) {
      var x1 = self.x(b.s, w), x2 = Math.max(self.x(b.e, w), x1 + 2);
      var top = y + 4, bh = row.kind === "rank" ? h - 12 : h - 13;
      var r = node("rect", { "class": "bar " + b.c, x: x1, y: top, width: x2 - x1, height: bh, rx: 2,
                             "data-title": b.t }, g);
      for (var k in b.d) { if (b.d[k] !== null) { r.setAttribute("data-" + k, b.d[k]); } }
      node("title", {}, r, b.t);
      var label = row.kind === "band" ? b.t : b.l;
      if (x2 - x1 > label.length * 6.6 + 8) {
        node("text", { "class": "bar-label", x: Math.max(x1, LABEL) + 4, y: top + bh / 2 + 4 }, g, label);
      } else if (x2 - x1 > b.l.length * 6.6 + 8) {
        node("text", { "class": "bar-label", x: Math.max(x1, LABEL) + 4, y: top + bh / 2 + 4 }, g, b.l);
      }
    });
    row.spans.forEach(function (s) {
      var x1 = self.x(s.s, w), x2 = Math.max(self.x(s.e, w), x1 + 1.5);
      var r = node("rect", { "class": s.c, x: x1, y: y + h - 7, width: x2 - x1, height: 4, "data-title": s.t }, g);
      node("title", {}, r, s.t);
    });
    row.marks.forEach(function (m) {
      if (m.c === "restart") { return; }
      var x = self.x(m.t, w);
      var mg = node("g", { "class": "mark " + m.c, "data-title": m.title }, g);
      node("line", { x1: x, x2: x, y1: y + 1, y2: y + h - 1 }, mg);
      node("text", { x: x + 3, y: y + h / 2 + 5 }, mg, m.l);
      node("title", {}, mg, m.title);
    });
  };

  JobView.prototype.drawCharts = function () {
    var self = this;
    if (this.trainingBox) {
      this.trainingBox.textContent = "";
      (this.job.training || []).forEach(function (chart, i) { self.drawChart(chart, "t" + i, self.trainingBox); });
    }
    if (!this.chartsBox) { return; }
    this.chartsBox.textContent = "";
    this.job.charts.forEach(function (chart, i) { self.drawChart(chart, i, self.chartsBox); });
  };

  JobView.prototype.drawChart = function (chart, index, container) {
    var box = html("div", "chart", container);
    box.setAttribute("data-metric", chart.title);
    html("h4", "", box, chart.title + (chart.unit ? " [" + chart.unit + "]" : "") +
         (chart.kind === "histogram" ? " (mean)" : ""));
    var W = 380, H = 170, L = 52, B = 20, T = 8, w = W - L - 8, h = H - B - T, self = this;
    var lo = Infinity, hi = -Infinity, lastRestart = {};
    chart.series.forEach(function (s) {
      s.points.forEach(function (p) { if (p[1] !== null) { lo = Math.min(lo, p[1]); hi = Math.max(hi, p[1]); } });
      var key = String(s.rank);
      lastRestart[key] = Math.max(lastRestart[key] === undefined ? -1 : lastRestart[key], s.restart || 0);
    });
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    if (hi === lo) { hi = lo + Math.max(1, Math.abs(lo) * 0.1); lo = lo - Math.max(1, Math.abs(lo) * 0.1); }
    var pad = (hi - lo) * 0.06; lo -= pad; hi += pad;
    var svg = node("svg", { width: "100%", viewBox: "0 0 " + W + " " + H, "class": "chart-svg" }, box);
    var clipId = "cclip-" + this.job.index + "-" + index;
    node("rect", { x: L, y: T, width: w, height: h }, node("clipPath", { id: clipId }, node("defs", {}, svg)));
    function X(t) { return L + (t - self.view.a) / (self.view.b - self.view.a) * w; }
    function Y(v) { return T + h - (v - lo) / (hi - lo) * h; }
    [lo + pad, (lo + hi) / 2, hi - pad].forEach(function (v) {
      node("line", { "class": "grid", x1: L, x2: L + w, y1: Y(v), y2: Y(v) }, svg);
      node("text", { "class": "tick", x: L - 4, y: Y(v) + 4, "text-anchor": "end" }, svg, number(v));
    });
    var step = niceStep(this.view.b - this.view.a, 4);
    for (var t = Math.ceil(this.view.a / step) * step; t <= this.view.b; t += step) {
      node("text", { "class": "tick", x: X(t), y: H - 5, "text-anchor": "middle" }, svg, seconds(t, step));
    }
    node("line", { "class": "axis", x1: L, x2: L, y1: T, y2: T + h }, svg);
    node("line", { "class": "axis", x1: L, x2: L + w, y1: T + h, y2: T + h }, svg);
    var lines = node("g", { "clip-path": "url(#" + clipId + ")" }, svg);
    var keys = html("div", "keys", box);
    chart.series.forEach(function (s) {
      var pts = s.points.filter(function (p) { return p[1] !== null; })
        .map(function (p) { return X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); });
      var earlier = (s.restart || 0) < lastRestart[String(s.rank)];
      var line = node("polyline", { points: pts.join(" "), stroke: color(s.rank), "class": earlier ? "earlier" : "",
                                    "data-rank": s.rank, "data-restart": s.restart }, lines);
      node("title", {}, line, s.label);
      if (pts.length === 1) {
        var xy = pts[0].split(",");
        node("circle", { cx: xy[0], cy: xy[1], r: 3.5, fill: color(s.rank) }, lines);
      }
      var key = html("span", "", keys);
      var sw = html("i", "", key);
      sw.style.background = color(s.rank);
      if (earlier) { sw.style.opacity = "0.5"; }
      key.appendChild(document.createTextNode(s.label));
    });
  };

  data.jobs.forEach(function (job) { new JobView(job); });
  document.documentElement.setAttribute("data-rendered", "true");
})();
"""
