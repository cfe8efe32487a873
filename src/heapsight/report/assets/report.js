/* heapsight report: draws every chart of the page as SVG from the JSON data block.
   Chart format: heapsight.lab.common (CHARTS) with the additions listed in
   heapsight/report/charts.py. No libraries, no network. Text from the data is only
   ever set with textContent. */
(function () {
  'use strict';
  var NS = 'http://www.w3.org/2000/svg';
  var PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948',
                 '#b07aa1', '#ff9da7', '#9c755f', '#bab0ac'];
  var started = performance.now();
  var charts = {};
  var state = {};   // per chart: zoomed x domain (x), series hidden from the legend (hidden)
  var pngId = null;
  var dragging = null;  // the chart being dragged across: finishes when the button is let go
  var NEAR_PX = 40;     // the tooltip leaves out lines whose nearest point is this much farther
  window.addEventListener('mouseup', function (ev) { if (dragging) dragging(ev); });

  // ------------------------------------------------------------------ DOM helpers
  function svg(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) { if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]); }
    if (parent) parent.appendChild(e);
    return e;
  }
  function html(tag, cls, text, parent) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    var t = svg('text', Object.assign({x: x, y: y}, attrs || {}), parent);
    t.textContent = s;
    return t;
  }

  // ------------------------------------------------------------------ numbers
  var BIN = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  function trim(s) { return s.indexOf('.') >= 0 ? s.replace(/\.?0+$/, '') : s; }
  function fin(v) { return typeof v === 'number' && isFinite(v); }
  function fmtBytes(v, digits) {
    var a = Math.abs(v), i = 0;
    while (a >= 1024 && i < BIN.length - 1) { a /= 1024; i++; }
    if (i === 0) return Math.round(v) + ' B';
    var s = (v / Math.pow(1024, i)).toFixed(digits);
    return (digits > 1 ? trim(s) : s) + ' ' + BIN[i];
  }
  function fmtSI(v, tick) {
    var a = Math.abs(v);
    if (a < 10000) {
      if (Number.isInteger(v)) return v.toLocaleString('en-US');
      return tick ? trim(v.toFixed(3)) : trim(v.toPrecision(4));
    }
    var units = [['G', 1e9], ['M', 1e6], ['k', 1e3]];
    for (var i = 0; i < units.length; i++) {
      if (a >= units[i][1]) return trim((v / units[i][1]).toPrecision(tick ? 4 : 3)) + units[i][0];
    }
    return String(v);
  }
  function fmtSec(v, tick) {
    var a = Math.abs(v);
    if (a === 0) return '0 s';
    var p = tick ? 4 : 3;
    if (a < 1e-3) return trim((v * 1e6).toPrecision(p)) + ' \u00b5s';
    if (a < 1) return trim((v * 1e3).toPrecision(p)) + ' ms';
    return trim(v.toPrecision(Math.max(p, String(Math.floor(a)).length))) + ' s';
  }
  function fmt(v, unit, tick) {
    if (!fin(v)) return '\u2013';
    switch (unit) {
      case 'bytes': return fmtBytes(v, tick ? 2 : 1);
      case 's': return fmtSec(v, tick);
      case '%': return trim(v.toFixed(Math.abs(v) < 10 ? 1 : 0)) + '%';
      case 'count': case '': case undefined: case null: return fmtSI(v, tick);
      case '/s': return fmtSI(v, tick) + (tick ? '' : '/s');
      default: return fmtSI(v, tick) + ' ' + unit;
    }
  }
  function axisTitle(ax) {
    var label = ax.label || '';
    var u = ax.unit;
    if (!u || u === 'count' || u === 'bytes' || u === 's') return label + (ax.log ? ' (log scale)' : '');
    if (u === '/s') return label + (ax.log ? ' (log scale)' : '');
    return label + ' (' + u + ')' + (ax.log ? ', log scale' : '');
  }

  // ------------------------------------------------------------------ scales and ticks
  function scale(d0, d1, r0, r1, log) {
    var f, inv;
    if (log) {
      var l0 = Math.log(d0), l1 = Math.log(d1);
      f = function (v) { return r0 + (Math.log(v > 0 ? v : d0) - l0) / (l1 - l0) * (r1 - r0); };
      inv = function (p) { return Math.exp(l0 + (p - r0) / (r1 - r0) * (l1 - l0)); };
    } else {
      f = function (v) { return r0 + (v - d0) / (d1 - d0) * (r1 - r0); };
      inv = function (p) { return d0 + (p - r0) / (r1 - r0) * (d1 - d0); };
    }
    f.inv = inv; f.d0 = d0; f.d1 = d1; f.log = log;
    return f;
  }
  function niceStep(raw) {
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
  }
  function linTicks(lo, hi, unit, n) {
    var raw = (hi - lo) / Math.max(1, n);
    if (!(raw > 0)) return [lo];
    // bytes step in powers of two (64 MiB, 128 MiB...), the nearest to the wanted step
    var step = (unit === 'bytes' && raw >= 1) ? Math.pow(2, Math.round(Math.log2(raw))) : niceStep(raw);
    if (unit === 'bytes' && (hi - lo) / step < 3 && step >= 2) step /= 2;
    if ((unit === 'count' || unit === 'bytes') && step < 1) step = 1;  // no half threads, no half bytes
    var out = [];
    for (var v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
      if (out.length > 50) break;
    }
    return out;
  }
  function logTicks(lo, hi, unit, n) {
    var base = unit === 'bytes' ? 2 : 10;
    var lb = function (v) { return Math.log(v) / Math.log(base); };
    var e0 = Math.ceil(lb(lo) - 1e-9), e1 = Math.floor(lb(hi) + 1e-9);
    var count = e1 - e0 + 1;
    if (base === 10 && count <= 3) {
      // a decade or two: 1, 2, 5 of each, so the axis has enough labels to read
      var few = [];
      for (var d = e0 - 1; d <= e1; d++) {
        [1, 2, 5].forEach(function (f) { var v = f * Math.pow(10, d); if (v >= lo && v <= hi) few.push(v); });
      }
      if (few.length >= 2) return few;
    }
    if (count < 2) return linTicks(lo, hi, unit, n);
    var strides = base === 2 ? [1, 2, 4, 10, 20] : [1, 2, 3, 5, 10];
    var stride = strides[strides.length - 1];
    for (var i = 0; i < strides.length; i++) {
      if (count / strides[i] <= n + 1) { stride = strides[i]; break; }
    }
    var out = [];
    for (var e = Math.ceil(e0 / stride) * stride; e <= e1; e += stride) out.push(Math.pow(base, e));
    return out;
  }
  function ticks(sc, unit, n) {
    return sc.log ? logTicks(sc.d0, sc.d1, unit, n) : linTicks(sc.d0, sc.d1, unit, n);
  }
  // Labels for ticks, never two alike on one axis: more digits until they differ, and a
  // tick whose label still repeats its neighbour's is left out.
  function tickLabels(values, unit) {
    var one = function (v, d) {
      if (unit === 'bytes') return fmtBytes(v, d);
      if (unit === 's' || unit === '%') return fmt(v, unit, true);
      var a = Math.abs(v);
      if (a >= 10000 && (unit === 'count' || !unit || unit === '/s')) {
        var u = a >= 1e9 ? ['G', 1e9] : a >= 1e6 ? ['M', 1e6] : ['k', 1e3];
        return trim((v / u[1]).toFixed(d)) + u[0];
      }
      return fmt(v, unit, true);
    };
    for (var d = 1; d <= 4; d++) {
      var labels = values.map(function (v) { return one(v, d); });
      var clash = labels.some(function (l, i) { return i && l === labels[i - 1]; });
      if (!clash) return labels;
    }
    return labels.map(function (l, i) { return i && l === labels[i - 1] ? null : l; });
  }
  // The y domain of values: from 0 when every value is >= 0 (bars and areas start there),
  // a little headroom on top; on a log axis, whole powers around the data.
  function yDomain(lo, hi, ax) {
    if (!fin(lo) || !fin(hi)) { lo = ax.log ? 1 : 0; hi = ax.log ? 10 : 1; }
    if (ax.log) {
      var b = ax.unit === 'bytes' ? 2 : 10;
      var l0 = Math.floor(Math.log(lo) / Math.log(b) + 1e-9), l1 = Math.ceil(Math.log(hi) / Math.log(b) - 1e-9);
      if (l1 <= l0) l1 = l0 + 1;
      return [Math.pow(b, l0), Math.pow(b, l1)];
    }
    if (fin(ax.min)) lo = Math.min(lo, ax.min);
    if (lo >= 0) lo = 0;
    if (hi <= lo) hi = lo + (lo === 0 ? 1 : Math.abs(lo) * 0.1);
    return [lo, hi + (hi - lo) * 0.06];
  }
  function xDomain(lo, hi, ax) {
    if (!fin(lo) || !fin(hi)) { lo = ax.log ? 1 : 0; hi = ax.log ? 10 : 1; }
    if (ax.log) {
      if (hi <= lo) { lo /= 2; hi *= 2; }
      var pad = Math.pow(hi / lo, 0.025);  // 2.5% of the width on each side: end points stay whole
      return [lo / pad, hi * pad];
    }
    if (fin(ax.min) && ax.min < lo) lo = ax.min;
    if (hi <= lo) { hi = lo + (lo === 0 ? 1 : Math.abs(lo) * 0.1); }
    return [lo, hi];
  }

  // ------------------------------------------------------------------ preparing series
  function color(s, i) { return s.color || PALETTE[i % PALETTE.length]; }
  function num(v) { return fin(v) ? v : null; }

  // Points of a line series sorted by x; invalid x dropped, null y kept (a gap).
  function prepLine(s, xlog, ylog) {
    var xs = s.x || [], ys = s.y || [], lo = s.lo || [], hi = s.hi || [];
    var idx = [];
    for (var i = 0; i < xs.length; i++) {
      if (fin(xs[i]) && (!xlog || xs[i] > 0)) idx.push(i);
    }
    var sorted = true;
    for (i = 1; i < idx.length; i++) if (xs[idx[i]] < xs[idx[i - 1]]) { sorted = false; break; }
    if (!sorted) idx.sort(function (a, b) { return xs[a] - xs[b]; });
    var P = {x: [], y: [], lo: [], hi: []};
    idx.forEach(function (j) {
      var y = num(ys[j]);
      if (ylog && y !== null && y <= 0) y = null;
      P.x.push(xs[j]); P.y.push(y);
      var l = num(lo[j]), h = num(hi[j]);
      P.lo.push(ylog && l !== null && l <= 0 ? null : l);
      P.hi.push(ylog && h !== null && h <= 0 ? null : h);
    });
    return P;
  }
  function nearest(xs, v) {
    var a = 0, b = xs.length - 1;
    if (b < 0) return -1;
    while (b - a > 1) { var m = (a + b) >> 1; if (xs[m] < v) a = m; else b = m; }
    return Math.abs(xs[a] - v) <= Math.abs(xs[b] - v) ? a : b;
  }

  // ------------------------------------------------------------------ axes
  function drawAxes(g, c, X, Y, m, W, H, xIsCat) {
    var pw = W - m.l - m.r, ph = H - m.t - m.b;
    var grid = svg('g', {'class': 'grid'}, g);
    var yt = ticks(Y, c.y.unit, Math.max(3, Math.round(ph / 55))).filter(function (v) {
      var y = Y(v);
      return y >= m.t - 0.5 && y <= m.t + ph + 0.5;
    });
    var yl = tickLabels(yt, c.y.unit);
    yt.forEach(function (v, i) {
      var y = Y(v);
      svg('line', {x1: m.l, x2: m.l + pw, y1: y, y2: y, 'class': v === 0 ? 'zero' : ''}, grid);
      if (yl[i] !== null) text(g, m.l - 7, y + 4, yl[i], {'class': 'tick tick-y', 'text-anchor': 'end'});
    });
    if (!xIsCat) {
      // a log axis over a few measured points (2 KiB, 20 KiB, ...): the ticks are the points
      var pts = [];
      (c.series || []).forEach(function (s) { (s.x || []).forEach(function (v) { if (fin(v) && pts.indexOf(v) < 0) pts.push(v); }); });
      pts.sort(function (a, b) { return a - b; });
      var xt = (X.log && pts.length >= 2 && pts.length <= 12) ? pts
        : ticks(X, c.x.unit, Math.max(3, Math.round(pw / 95)));
      xt = xt.filter(function (v) { var x = X(v); return x >= m.l - 0.5 && x <= m.l + pw + 0.5; });
      var xl = tickLabels(xt, c.x.unit), lastRight = -Infinity;
      xt.forEach(function (v, i) {
        var x = X(v);
        svg('line', {x1: x, x2: x, y1: m.t, y2: m.t + ph}, grid);
        var w = (xl[i] || '').length * 6.4;
        if (xl[i] === null || x - w / 2 < lastRight + 6) return;   // no label over another
        lastRight = x + w / 2;
        text(g, x, m.t + ph + 16, xl[i], {'class': 'tick tick-x', 'text-anchor': 'middle'});
      });
    }
    svg('line', {x1: m.l, x2: m.l + pw, y1: m.t + ph, y2: m.t + ph, 'class': 'axis'}, g);
    svg('line', {x1: m.l, x2: m.l, y1: m.t, y2: m.t + ph, 'class': 'axis'}, g);
    text(g, m.l + pw / 2, H - 6, axisTitle(c.x), {'class': 'axis-title', 'text-anchor': 'middle'});
    text(g, 0, 0, axisTitle(c.y), {'class': 'axis-title', 'text-anchor': 'middle',
      transform: 'translate(14,' + (m.t + ph / 2) + ') rotate(-90)'});
  }

  // ------------------------------------------------------------------ line and stacked charts
  function linePath(P, X, Y, key, step) {
    var d = '', pen = false;
    for (var i = 0; i < P.x.length; i++) {
      var v = P[key][i];
      if (v === null) { pen = false; continue; }
      var x = X(P.x[i]), y = Y(v);
      if (!pen) { d += 'M' + x.toFixed(1) + ' ' + y.toFixed(1); pen = true; }
      else if (step) d += 'H' + x.toFixed(1) + 'V' + y.toFixed(1);
      else d += 'L' + x.toFixed(1) + ' ' + y.toFixed(1);
    }
    return d;
  }
  function bandPath(P, X, Y) {
    var top = [], bot = [];
    for (var i = 0; i < P.x.length; i++) {
      if (P.lo[i] === null || P.hi[i] === null) continue;
      top.push(X(P.x[i]).toFixed(1) + ' ' + Y(P.hi[i]).toFixed(1));
      bot.push(X(P.x[i]).toFixed(1) + ' ' + Y(P.lo[i]).toFixed(1));
    }
    if (top.length < 2) return '';
    return 'M' + top.join('L') + 'L' + bot.reverse().join('L') + 'Z';
  }

  function prepXY(c) {
    var xlog = !!c.x.log, ylog = !!c.y.log;
    var series = c.series || [];
    var out = {lines: [], stack: null};
    if (c.kind === 'stacked') {
      var base = [];
      series.forEach(function (s, i) { if (s.stack !== false) base.push({s: s, i: i}); });
      var X0 = (base[0] && base[0].s.x) || [];
      var order = [];
      for (var i = 0; i < X0.length; i++) if (fin(X0[i])) order.push(i);
      order.sort(function (a, b) { return X0[a] - X0[b]; });
      var xs = order.map(function (j) { return X0[j]; });
      var cum = xs.map(function () { return 0; });
      var bands = base.map(function (b) {
        var lo = cum.slice();
        var vals = order.map(function (j) { var v = (b.s.y || [])[j]; return fin(v) ? v : null; });
        cum = cum.map(function (v, k) { return v + (vals[k] || 0); });
        return {s: b.s, i: b.i, x: xs, lo: lo, hi: cum.slice(), y: vals};
      });
      out.stack = {x: xs, bands: bands, top: cum};
    }
    series.forEach(function (s, i) {
      if (c.kind === 'stacked' && s.stack !== false) return;
      out.lines.push({s: s, i: i, P: prepLine(s, xlog, ylog)});
    });
    return out;
  }

  function drawXY(fig, c, box, W, H) {
    var D = prepXY(c);
    var xlog = !!c.x.log, ylog = !!c.y.log;
    // x extent over every series
    var x0 = Infinity, x1 = -Infinity;
    function takeX(xs) {
      xs.forEach(function (v) {
        if (fin(v) && (!xlog || v > 0)) { if (v < x0) x0 = v; if (v > x1) x1 = v; }
      });
    }
    if (D.stack) takeX(D.stack.x);
    D.lines.forEach(function (L) { takeX(L.P.x); });
    (c.markers || []).forEach(function (mk) { if (fin(mk.x)) takeX([mk.x]); });
    var full = xDomain(x0, x1, c.x);
    var dom = state[c.id] && state[c.id].x ? state[c.id].x : full;
    var inX = function (v) { return v >= dom[0] && v <= dom[1]; };
    // y extent over what is visible
    var y0 = Infinity, y1 = -Infinity;
    function takeY(v) { if (fin(v) && (!ylog || v > 0)) { if (v < y0) y0 = v; if (v > y1) y1 = v; } }
    function visibleRange(xs, fn) {
      var a = nearest(xs, dom[0]), b = nearest(xs, dom[1]);
      if (a < 0) return;
      a = Math.max(0, a - 1); b = Math.min(xs.length - 1, b + 1);
      for (var k = a; k <= b; k++) fn(k);
    }
    if (D.stack) {
      visibleRange(D.stack.x, function (k) { takeY(D.stack.top[k]); if (!ylog) takeY(0); });
    }
    D.lines.forEach(function (L) {
      visibleRange(L.P.x, function (k) { takeY(L.P.y[k]); takeY(L.P.lo[k]); takeY(L.P.hi[k]); });
    });
    var ydom = yDomain(y0, y1, c.y);
    var shownMarkers = (c.markers || []).filter(function (mk) { return fin(mk.x) && inX(mk.x); });
    var m = {l: 78, r: 20, t: 14 + 16 * shownMarkers.length, b: 44};
    var pw = W - m.l - m.r, ph = H - m.t - m.b;
    var X = scale(dom[0], dom[1], m.l, m.l + pw, xlog), Y = scale(ydom[0], ydom[1], m.t + ph, m.t, ylog);
    var root = svg('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, 'class': 'plot',
      role: 'img'}, box);
    root.setAttribute('aria-label', c.title || c.id);
    drawAxes(root, c, X, Y, m, W, H, false);
    var clipId = 'clip-' + c.id;
    var cp = svg('clipPath', {id: clipId}, svg('defs', {}, root));
    svg('rect', {x: m.l, y: m.t - 1, width: pw, height: ph + 2}, cp);
    var g = svg('g', {'clip-path': 'url(#' + clipId + ')'}, root);
    var marks = 0;
    if (D.stack) {
      D.stack.bands.forEach(function (b) {
        var top = [], bot = [];
        for (var k = 0; k < b.x.length; k++) {
          top.push(X(b.x[k]).toFixed(1) + ' ' + Y(b.hi[k]).toFixed(1));
          bot.push(X(b.x[k]).toFixed(1) + ' ' + Y(b.lo[k]).toFixed(1));
        }
        if (!top.length) return;
        svg('path', {d: 'M' + top.join('L') + 'L' + bot.reverse().join('L') + 'Z',
          fill: color(b.s, b.i), 'fill-opacity': 0.82, stroke: color(b.s, b.i), 'stroke-width': 0.6,
          'class': 'area'}, g);
        marks++;
      });
    }
    D.lines.forEach(function (L) {
      var col = color(L.s, L.i);
      var band = bandPath(L.P, X, Y);
      if (band) {
        svg('path', {d: band, fill: col, 'fill-opacity': 0.16, stroke: 'none', 'class': 'band'}, g);
        marks++;
      }
      var d = linePath(L.P, X, Y, 'y', !!L.s.step);
      if (d) {
        svg('path', {d: d, fill: 'none', stroke: col, 'stroke-width': D.stack ? 1.4 : 2,
          'stroke-linejoin': 'round', 'stroke-dasharray': L.s.dash ? '5 4' : null, 'class': 'line'}, g);
        marks++;
      }
      // few points: each one drawn, so a reader sees where the measurements are
      var shown = L.P.x.filter(inX).length;
      if (!D.stack && shown > 0 && shown <= 24 && !L.s.step) {
        for (var k = 0; k < L.P.x.length; k++) {
          if (L.P.y[k] === null || !inX(L.P.x[k])) continue;
          svg('circle', {cx: X(L.P.x[k]), cy: Y(L.P.y[k]), r: 3, fill: '#fff', stroke: col,
            'stroke-width': 1.6, 'class': 'dot'}, g);
        }
      }
    });
    // markers: labelled vertical lines, each label on its own row above the plot
    var mg = svg('g', {'class': 'markers'}, root);
    shownMarkers.forEach(function (mk, i) {
      var x = X(mk.x), ty = 12 + 16 * i;
      svg('line', {x1: x, x2: x, y1: ty + 3, y2: m.t + ph, 'class': 'marker'}, mg);
      var right = x > m.l + pw * 0.6;
      text(mg, right ? x - 5 : x + 5, ty, mk.label || '',
        {'class': 'marker-label', 'text-anchor': right ? 'end' : 'start'});
    });
    fig.dataset.marks = marks;
    interactXY(fig, c, root, D, X, Y, m, pw, ph, full);
    return marks;
  }

  function interactXY(fig, c, root, D, X, Y, m, pw, ph, full) {
    if (pngId) return;
    var guide = svg('g', {'class': 'hover', visibility: 'hidden'}, root);
    var vline = svg('line', {y1: m.t, y2: m.t + ph, 'class': 'guide'}, guide);
    var sel = svg('rect', {y: m.t, height: ph, 'class': 'selection', visibility: 'hidden'}, root);
    var overlay = svg('rect', {x: m.l, y: m.t, width: pw, height: ph, fill: 'transparent',
      'class': 'overlay'}, root);
    var tip = fig.querySelector('.tip');
    var dragFrom = null;
    function local(ev) {
      var r = root.getBoundingClientRect();
      return [ev.clientX - r.left, ev.clientY - r.top];
    }
    function hover(px, py) {
      var xv = X.inv(px);
      var rows = [], xAt = null;
      while (guide.childNodes.length > 1) guide.removeChild(guide.lastChild);
      if (D.stack && D.stack.x.length) {
        var k = nearest(D.stack.x, xv);
        xAt = D.stack.x[k];
        D.stack.bands.slice().reverse().forEach(function (b) {  // top band first, as drawn
          rows.push([color(b.s, b.i), b.s.name, fmt(b.y[k], c.y.unit)]);
        });
      }
      var near = D.lines.map(function (L) {
        var k = nearest(L.P.x, xv);
        return k < 0 ? [k, Infinity] : [k, Math.abs(X(L.P.x[k]) - px)];
      });
      var closest = near.reduce(function (a, n) { return Math.min(a, n[1]); }, D.stack ? 0 : Infinity);
      D.lines.forEach(function (L, li) {
        var k = near[li][0];
        // a line whose points are all far from here (it ended earlier) is left out
        if (k < 0 || near[li][1] > closest + NEAR_PX) return;
        if (xAt === null) xAt = L.P.x[k];
        var v = L.P.y[k];
        var s = fmt(v, c.y.unit);
        if (L.P.lo[k] !== null && L.P.hi[k] !== null) {
          s += '  (' + fmt(L.P.lo[k], c.y.unit) + ' \u2013 ' + fmt(L.P.hi[k], c.y.unit) + ')';
        }
        rows.push([color(L.s, L.i), L.s.name, s, L.P.x[k]]);
        if (v !== null && L.P.x[k] >= X.d0 && L.P.x[k] <= X.d1) {
          svg('circle', {cx: X(L.P.x[k]), cy: Y(v), r: 4, fill: color(L.s, L.i), stroke: '#fff', 'stroke-width': 1.5}, guide);
        }
      });
      if (xAt === null) return;
      var gx = X(xAt);
      vline.setAttribute('x1', gx); vline.setAttribute('x2', gx);
      guide.setAttribute('visibility', 'visible');
      showTip(fig, tip, root, px, py, c.x.label + ' ' + fmt(xAt, c.x.unit), rows.map(function (r) {
        return [r[0], r[1], r[2] + (r[3] !== undefined && r[3] !== xAt ? '  @ ' + fmt(r[3], c.x.unit) : '')];
      }));
    }
    overlay.addEventListener('mousemove', function (ev) {
      var p = local(ev);
      if (dragFrom !== null) {
        var a = Math.max(m.l, Math.min(dragFrom, p[0])), b = Math.min(m.l + pw, Math.max(dragFrom, p[0]));
        sel.setAttribute('x', a); sel.setAttribute('width', Math.max(0, b - a));
        sel.setAttribute('visibility', 'visible');
      }
      hover(p[0], p[1]);
    });
    overlay.addEventListener('mouseleave', function () {
      guide.setAttribute('visibility', 'hidden'); tip.style.display = 'none';
    });
    overlay.addEventListener('mousedown', function (ev) {
      if (ev.button !== 0) return;
      dragFrom = local(ev)[0];
      dragging = finish;
      ev.preventDefault();
    });
    function finish(ev) {
      dragging = null;
      if (dragFrom === null) return;
      var px = local(ev)[0];
      var a = Math.min(dragFrom, px), b = Math.max(dragFrom, px);
      dragFrom = null;
      sel.setAttribute('visibility', 'hidden');
      if (b - a < 6) return;
      var lo = X.inv(Math.max(a, m.l)), hi = X.inv(Math.min(b, m.l + pw));
      state[c.id] = Object.assign(state[c.id] || {}, {x: [lo, hi]});
      tip.style.display = 'none';
      draw(c.id);
    }
    overlay.addEventListener('mouseup', finish);
    overlay.addEventListener('dblclick', function () {
      if (state[c.id] && state[c.id].x) { delete state[c.id].x; tip.style.display = 'none'; draw(c.id); }
    });
  }

  function showTip(fig, tip, root, px, py, head, rows) {
    tip.textContent = '';
    html('div', 'tip-head', head, tip);
    rows.forEach(function (r) {
      var line = html('div', 'tip-row', null, tip);
      var sw = html('span', 'sw', null, line);
      sw.style.background = r[0];
      html('span', 'tip-name', r[1], line);
      html('span', 'tip-val', r[2], line);
    });
    tip.style.display = 'block';
    var fr = fig.getBoundingClientRect(), rr = root.getBoundingClientRect();
    var x = rr.left - fr.left + px + 14, y = rr.top - fr.top + py - tip.offsetHeight - 12;
    if (y < 0) y = rr.top - fr.top + 4;   // above the plot's top edge: pin it there
    if (x + tip.offsetWidth > fig.clientWidth - 4) x = rr.left - fr.left + px - tip.offsetWidth - 14;
    if (x < 0) x = 4;
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  }

  // ------------------------------------------------------------------ bar charts
  function drawBars(fig, c, box, W, H) {
    var series = c.series || [];
    var cats = (c.x && c.x.categories) || (series[0] && series[0].x) || [];
    var ylog = !!c.y.log;
    var y0 = Infinity, y1 = -Infinity;
    series.forEach(function (s) {
      ['y', 'lo', 'hi'].forEach(function (k) {
        (s[k] || []).forEach(function (v) { if (fin(v) && (!ylog || v > 0)) { y0 = Math.min(y0, v); y1 = Math.max(y1, v); } });
      });
    });
    var ydom = yDomain(y0, y1, c.y);
    // category labels: turned when they do not fit under their group
    var longest = cats.reduce(function (a, s) { return Math.max(a, String(s).length); }, 0);
    var m = {l: 78, r: 20, t: 18, b: 44};
    var groupW = (W - m.l - m.r) / Math.max(1, cats.length);
    var turn = longest * 6.6 > groupW - 6;
    if (turn) m.b = Math.min(H * 0.45, 30 + longest * 5.2);
    var pw = W - m.l - m.r, ph = H - m.t - m.b;
    var Y = scale(ydom[0], ydom[1], m.t + ph, m.t, ylog);
    var root = svg('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, 'class': 'plot', role: 'img'}, box);
    root.setAttribute('aria-label', c.title || c.id);
    drawAxes(root, c, null, Y, m, W, H, true);
    var inner = groupW * 0.78, bw = inner / Math.max(1, series.length);
    var g = svg('g', {}, root);
    var marks = 0;
    var base = ylog ? Y(ydom[0]) : Y(Math.max(ydom[0], 0));
    var widest = 0;
    series.forEach(function (s) { (s.y || []).forEach(function (v) { if (fin(v)) widest = Math.max(widest, fmt(v, c.y.unit).length); }); });
    var labels = bw >= widest * 6.2 + 6 && cats.length * series.length <= 36;
    cats.forEach(function (cat, j) {
      var gx = m.l + groupW * j + (groupW - inner) / 2;
      var lx = m.l + groupW * (j + 0.5);
      if (turn) {
        text(root, lx, m.t + ph + 12, String(cat), {'class': 'tick cat', 'text-anchor': 'end',
          transform: 'rotate(-35 ' + lx + ' ' + (m.t + ph + 12) + ')'});
      } else {
        text(root, lx, m.t + ph + 17, String(cat), {'class': 'tick cat', 'text-anchor': 'middle'});
      }
      series.forEach(function (s, i) {
        var v = (s.y || [])[j];
        if (!fin(v) || (ylog && v <= 0)) return;
        var x = gx + bw * i, y = Y(v);
        svg('rect', {x: (x + 1).toFixed(1), y: Math.min(y, base).toFixed(1), width: Math.max(1, bw - 2).toFixed(1),
          height: Math.abs(base - y).toFixed(1), fill: color(s, i), 'class': 'bar'}, g);
        marks++;
        var lo = (s.lo || [])[j], hi = (s.hi || [])[j], top = y;
        if (fin(lo) && fin(hi) && (!ylog || lo > 0) && hi > lo) {
          var cx = x + bw / 2, w = Math.min(10, bw * 0.35);
          svg('path', {d: 'M' + cx + ' ' + Y(lo) + 'V' + Y(hi) + 'M' + (cx - w / 2) + ' ' + Y(lo) + 'h' + w +
            'M' + (cx - w / 2) + ' ' + Y(hi) + 'h' + w, 'class': 'whisker'}, g);
          top = Math.min(top, Y(hi));
        }
        if (labels) text(g, x + bw / 2, top - 4, fmt(v, c.y.unit), {'class': 'bar-label', 'text-anchor': 'middle'});
      });
    });
    fig.dataset.marks = marks;
    if (!pngId) {
      var tip = fig.querySelector('.tip');
      var hl = svg('rect', {y: m.t, height: ph, width: groupW, 'class': 'cat-hover', visibility: 'hidden'}, root);
      root.insertBefore(hl, g);
      var overlay = svg('rect', {x: m.l, y: m.t, width: pw, height: ph, fill: 'transparent', 'class': 'overlay'}, root);
      overlay.addEventListener('mousemove', function (ev) {
        var r = root.getBoundingClientRect();
        var px = ev.clientX - r.left, py = ev.clientY - r.top;
        var j = Math.floor((px - m.l) / groupW);
        if (j < 0 || j >= cats.length) return;
        hl.setAttribute('x', m.l + groupW * j); hl.setAttribute('visibility', 'visible');
        showTip(fig, tip, root, px, py, String(cats[j]), series.map(function (s, i) {
          var v = (s.y || [])[j], lo = (s.lo || [])[j], hi = (s.hi || [])[j];
          var t = fmt(v, c.y.unit);
          if (fin(lo) && fin(hi)) t += '  (' + fmt(lo, c.y.unit) + ' \u2013 ' + fmt(hi, c.y.unit) + ')';
          return [color(s, i), s.name, t];
        }));
      });
      overlay.addEventListener('mouseleave', function () { hl.setAttribute('visibility', 'hidden'); tip.style.display = 'none'; });
    }
    return marks;
  }

  // ------------------------------------------------------------------ one chart
  function draw(id) {
    var c = charts[id];
    var fig = document.getElementById('fig-' + id);
    if (!c || !fig) throw new Error('chart ' + id + ' has no ' + (c ? 'place on the page' : 'data'));
    fig.textContent = '';
    html('div', 'chart-title', c.title || id, fig);
    var legend = html('div', 'legend', null, fig);
    var hidden = (state[id] && state[id].hidden) || {};
    (c.series || []).forEach(function (s, i) {
      var has = (s.y || []).some(fin);
      if (!has) return;   // a series with nothing to draw is not listed
      var item = html('span', 'legend-item' + (hidden[s.name] ? ' off' : ''), null, legend);
      item.title = hidden[s.name] ? 'click to show' : 'click to hide';
      var sw = html('span', 'sw' + ((c.kind === 'line' || s.stack === false) ? ' sw-line' : ''), null, item);
      sw.style.background = s.dash ? 'repeating-linear-gradient(90deg, ' + color(s, i) + ' 0 5px, transparent 5px 8px)'
        : color(s, i);
      html('span', null, s.name, item);
      item.addEventListener('click', function () {
        state[id] = state[id] || {};
        state[id].hidden = state[id].hidden || {};
        state[id].hidden[s.name] = !state[id].hidden[s.name];
        draw(id);
      });
    });
    if (state[id] && state[id].x) html('span', 'zoomed', 'zoomed in: double-click to reset', legend);
    var box = html('div', 'plotbox', null, fig);
    if (c.note) html('div', 'note', c.note, fig);
    var tip = html('div', 'tip', null, fig);
    tip.style.display = 'none';
    var W = Math.max(320, Math.floor(box.clientWidth || fig.clientWidth || 640));
    var H = pngId ? Math.max(200, Math.floor(box.clientHeight)) : (c.height || 320);
    c.x = c.x || {}; c.y = c.y || {};
    // hidden series are left out of the drawing (colours stay: they come with each series)
    var shown = c;
    if (Object.keys(hidden).some(function (k) { return hidden[k]; })) {
      shown = Object.assign({}, c, {series: (c.series || []).map(function (s, i) {
        return Object.assign({}, s, {color: color(s, i)});
      }).filter(function (s) { return !hidden[s.name]; })});
    }
    var marks = c.kind === 'bar' ? drawBars(fig, shown, box, W, H) : drawXY(fig, shown, box, W, H);
    fig.dataset.drawn = 'yes';
    return marks;
  }

  // What a reader of the page sees, checked on the page itself (the tests read it back):
  // no axis repeats a tick label, no two labels overlap, and the first run's verdict, its
  // breakdown and its first suggestion are in the first screen.
  function layoutCheck() {
    var repeats = 0, overlaps = 0;
    document.querySelectorAll('svg.plot').forEach(function (root) {
      ['tick-x', 'tick-y'].forEach(function (cls) {
        var ls = Array.prototype.map.call(root.querySelectorAll('.' + cls), function (t) { return t.textContent; });
        for (var i = 1; i < ls.length; i++) if (ls[i] === ls[i - 1]) repeats++;
      });
      var boxes = Array.prototype.map.call(root.querySelectorAll('.tick, .bar-label'), function (t) {
        return t.getBoundingClientRect();
      }).filter(function (r) { return r.width > 0; });
      for (var i = 0; i < boxes.length; i++) {
        for (var j = i + 1; j < boxes.length; j++) {
          var a = boxes[i], b = boxes[j];
          if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1) overlaps++;
        }
      }
    });
    var seen = [];
    var run = document.querySelector('section.run');
    if (run) {
      [['verdict', '.verdict'], ['breakdown', 'table.breakdown'], ['suggestion', '.findings li']].forEach(function (q) {
        var el = run.querySelector(q[1]);
        if (el && el.getBoundingClientRect().bottom <= window.innerHeight) seen.push(q[0]);
      });
    }
    document.body.dataset.tickRepeats = String(repeats);
    document.body.dataset.overlaps = String(overlaps);
    document.body.dataset.firstScreen = seen.join(',');
    document.body.dataset.viewport = window.innerWidth + 'x' + window.innerHeight;
  }

  function health(drawn) {
    var errs = (window.__hs && window.__hs.errors) || [];
    if (!pngId) layoutCheck();
    document.body.dataset.charts = drawn + ' drawn';
    document.body.dataset.errors = String(errs.length);
    var box = document.getElementById('hs-errors');
    if (box) {
      box.textContent = errs.length ? 'errors on this page: ' + errs.join(' | ') : '';
      box.style.display = errs.length ? 'block' : 'none';
    }
  }

  function drawAll() {
    var drawn = 0;
    var ids = pngId ? [pngId] : Object.keys(charts);
    ids.forEach(function (id) {
      try {
        draw(id);
        drawn++;
      } catch (e) {
        console.error('chart ' + id + ': ' + (e && e.message ? e.message : e));
        var fig = document.getElementById('fig-' + id);
        if (fig) html('div', 'chart-error', 'this chart could not be drawn: ' + (e && e.message ? e.message : e), fig);
      }
    });
    return drawn;
  }

  function start() {
    var data = JSON.parse(document.getElementById('hs-data').textContent);
    (data.charts || []).forEach(function (c) { charts[c.id] = c; });
    // #png=CHART_ID&w=W&h=H: that chart alone, W x H CSS pixels (given, because a headless
    // window's inner size at load time is not yet the size of the screenshot)
    var m = /^#png=([^&]+)(?:&w=(\d+)&h=(\d+))?$/.exec(location.hash);
    if (m) {
      pngId = decodeURIComponent(m[1]);
      var fig = document.getElementById('fig-' + pngId);
      if (!fig) throw new Error('no chart ' + pngId + ' on this page');
      document.documentElement.classList.add('png');
      fig.classList.add('solo');
      if (m[2]) { fig.style.width = m[2] + 'px'; fig.style.height = m[3] + 'px'; }
      document.body.appendChild(fig);
    }
    var drawn = drawAll();
    document.body.dataset.renderMs = String(Math.round(performance.now() - started));
    health(drawn);
    if (window.__hs) window.__hs.onerror = function () { health(drawn); };
    if (!pngId) {
      var pending = null;
      window.addEventListener('resize', function () {
        clearTimeout(pending);
        pending = setTimeout(function () { drawn = drawAll(); health(drawn); }, 150);
      });
    }
  }

  try {
    start();
  } catch (e) {
    console.error('report: ' + (e && e.message ? e.message : e));
    health(0);
  }
})();
