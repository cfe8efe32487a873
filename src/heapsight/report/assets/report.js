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
  // A call site's name in a narrow cell: it may wrap only after '::', '<', ',', '(', '/'
  // or a space (a <wbr> after each), so a C++ name breaks between its parts, not mid-word.
  var SITE_BREAKS = /(::|[<,(\/ ])/;
  function siteCell(tr, name) {
    var td = html('td', 'site', null, tr);
    String(name).split(SITE_BREAKS).forEach(function (part, i) {
      if (!part) return;
      td.appendChild(document.createTextNode(part));
      if (i % 2 === 1) td.appendChild(document.createElement('wbr'));
    });
    return td;
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
    // the nearest of 1, 2, 5 (not the next above: a 1.4 s run got 3 ticks, 0.5 s apart)
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
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
    // Several lines over few points (the lab's allocators at 0% and 100%) lie on each
    // other: each is drawn a few pixels apart (dodged), so that every colour shows; the
    // figures in the tooltip and the table stay exact. The clip makes room for them.
    var dodge = !D.stack && D.lines.length >= 3 && D.lines.every(function (L) {
      return L.P.x.length <= 24; });
    var spread = dodge ? 4 : 0;   // each line is moved into the plot, never out of it
    svg('rect', {x: m.l, y: m.t - 1 - spread, width: pw, height: ph + 2 + 2 * spread}, cp);
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
    D.lines.forEach(function (L, n) {
      var col = color(L.s, L.i);
      // the n-th line 2n px into the plot: down from the top half, up from the bottom
      var mid = (m.t + m.t + ph) / 2;
      var Yl = dodge && n ? function (v) { var y = Y(v); return y + (y < mid ? 1 : -1) * n * 2; } : Y;
      var band = bandPath(L.P, X, Yl);
      if (band) {
        svg('path', {d: band, fill: col, 'fill-opacity': 0.16, stroke: 'none', 'class': 'band'}, g);
        marks++;
      }
      var d = linePath(L.P, X, Yl, 'y', !!L.s.step);
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
          svg('circle', {cx: X(L.P.x[k]), cy: Yl(L.P.y[k]), r: 3, fill: '#fff', stroke: col,
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
        if (v === 0) {
          // a measured zero, not a missing bar: a mark on the baseline, and its figure
          svg('rect', {x: (x + 1).toFixed(1), y: (base - 2).toFixed(1), width: Math.max(1, bw - 2).toFixed(1),
            height: 2, fill: color(s, i), 'class': 'bar zero'}, g);
          if (!labels) text(g, x + bw / 2, base - 5, '0', {'class': 'bar-label', 'text-anchor': 'middle'});
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

  // ------------------------------------------------------------------ flame graph
  // The sampled call paths as an icicle: the root (every sampled byte live at the moment)
  // on top, each caller above what it calls, one box per (frame, path) as wide as the
  // bytes allocated through it. The paths come merged into one tree (report/holders.py);
  // here a moment's bytes are summed up that tree once, and only boxes at least a pixel
  // wide are laid out (children largest first: once one is too narrow, the rest are).
  var FLAME_ROW = 18, FLAME_FONT = 11, FLAME_AXIS = 40;
  var KIND_HSL = {program: [24, 80, 62], libc: [178, 38, 56], runtime: [268, 32, 66],
                  library: [45, 70, 58], unknown: [210, 6, 72]};
  var ROOT_COLOR = '#c9ced4';
  var flameCache = {};
  var measureCtx = null;

  function flameTree(c) {
    if (flameCache[c.id]) return flameCache[c.id];
    var n = c.up.length, parent = new Int32Array(n);
    parent[0] = -1;
    for (var u = 1; u < n; u++) parent[u] = u - c.up[u];
    // each node's children as a range of one array (a counting sort by parent)
    var start = new Int32Array(n + 1);
    for (var i = 1; i < n; i++) start[parent[i] + 1]++;
    for (i = 0; i < n; i++) start[i + 1] += start[i];
    var kids = new Int32Array(Math.max(1, n - 1)), at = start.slice(0, n);
    var depth = new Int32Array(n);
    for (i = 1; i < n; i++) { kids[at[parent[i]]++] = i; depth[i] = depth[parent[i]] + 1; }
    var labels = c.frames.map(function (f) {
      if (f[0]) return String(f[0]);
      // unnamed: OBJECT+ADDRESS, as the call sites table names it
      var obj = (c.objects[f[3]] || {}).path || '';
      return (obj ? obj.split('/').pop() : '?') + '+' + (f[4] ? String(f[4]) : '?');
    });
    var colors = c.frames.map(function (f, i) {
      var kind = (c.objects[f[3]] || {}).kind || 'unknown', hsl = KIND_HSL[kind] || KIND_HSL.unknown;
      var h = 0, s = labels[i];
      for (var k = 0; k < s.length; k++) h = (h * 31 + s.charCodeAt(k)) | 0;
      // neighbours of one kind differ a little in lightness, as in flame graphs
      return 'hsl(' + hsl[0] + ',' + hsl[1] + '%,' + (hsl[2] + ((h >>> 0) % 13) - 6) + '%)';
    });
    return (flameCache[c.id] = {n: n, parent: parent, start: start, kids: kids, depth: depth, labels: labels,
                                colors: colors, moments: {}});
  }
  function flameSums(c, t, mi) {
    if (t.moments[mi]) return t.moments[mi];
    var M = c.moments[mi], n = t.n;
    var bytes = new Float64Array(n), own = new Float64Array(n), blocks = new Float64Array(n),
        err2 = new Float64Array(n);
    for (var j = 0; j < M.node.length; j++) {
      var k = M.node[j];
      bytes[k] += M.bytes[j]; own[k] += M.bytes[j]; blocks[k] += M.blocks[j]; err2[k] += M.err[j] * M.err[j];
    }
    for (var i = n - 1; i > 0; i--) {   // parents come before their children
      var p = t.parent[i];
      bytes[p] += bytes[i]; blocks[p] += blocks[i]; err2[p] += err2[i];
    }
    return (t.moments[mi] = {bytes: bytes, own: own, blocks: blocks, err2: err2, sorted: {}});
  }
  function sortedKids(c, t, s, k) {
    var o = s.sorted[k];
    if (o) return o;
    o = [];
    for (var i = t.start[k]; i < t.start[k + 1]; i++) if (s.bytes[t.kids[i]] > 0) o.push(t.kids[i]);
    // largest first; equal ones by name, so a redraw puts them in the same place
    o.sort(function (a, b) {
      var la = t.labels[c.frame[a]], lb = t.labels[c.frame[b]];
      return s.bytes[b] - s.bytes[a] || (la < lb ? -1 : la > lb ? 1 : a - b);
    });
    return (s.sorted[k] = o);
  }
  // The boxes to draw with `zoom` as wide as the plot: its callers above it (full width),
  // then everything under it.
  function flameLayout(c, t, s, zoom, W) {
    var boxes = [], chain = [];
    for (var a = zoom; a > 0; a = t.parent[a]) chain.push(a);
    chain.push(0);
    chain.reverse().forEach(function (a) { boxes.push([a, 0, W, a !== zoom]); });
    var per = W / s.bytes[zoom];
    (function walk(n, x) {
      var ks = sortedKids(c, t, s, n);
      for (var i = 0; i < ks.length; i++) {
        var w = s.bytes[ks[i]] * per;
        if (w < 1) break;
        boxes.push([ks[i], x, w, false]);
        walk(ks[i], x);
        x += w;
      }
    })(zoom, 0);
    return boxes;
  }
  function measurer(el) {
    if (!measureCtx) measureCtx = document.createElement('canvas').getContext('2d');
    measureCtx.font = FLAME_FONT + 'px ' + getComputedStyle(el).fontFamily;
    return function (s) { return measureCtx.measureText(s).width; };
  }
  // The label that fits in `room` pixels: whole, or cut with an ellipsis, or none.
  function fitLabel(s, room, measure) {
    if (room < 16) return null;
    if (measure(s) <= room) return s;
    var lo = 0, hi = s.length - 1;
    while (lo < hi) {
      var mid = (lo + hi + 1) >> 1;
      if (measure(s.slice(0, mid) + '\u2026') <= room) lo = mid; else hi = mid - 1;
    }
    return lo >= 3 ? s.slice(0, lo) + '\u2026' : null;
  }
  function momentName(M) {
    var at = fin(M.t_s) ? ' at ' + fmtSec(M.t_s) : '';
    return String(M.name || '?') + at;
  }
  function bytesPm(v, e2) {
    return fmtBytes(v, 1) + (e2 > 0 ? ' \u00b1 ' + fmtBytes(Math.sqrt(e2), 1) : '');
  }
  function share(v, of) { return of > 0 ? fmt(100 * v / of, '%') : '\u2013'; }
  function count(v) { return fin(v) ? Math.round(v).toLocaleString('en-US') : '\u2013'; }

  function controls(fig) { return html('div', 'controls', null, fig); }
  function selector(parent, label, names, chosen, onchange) {
    var l = html('label', 'select', null, parent);
    html('span', null, label + ' ', l);
    var sel = html('select', null, null, l);
    names.forEach(function (n, i) {
      var o = html('option', null, n, sel);
      o.value = String(i);
      if (i === chosen) o.selected = true;
    });
    sel.addEventListener('change', function () { onchange(parseInt(sel.value, 10)); });
    return sel;
  }

  function drawFlame(fig, c) {
    var st = state[c.id] = state[c.id] || {};
    var t = flameTree(c);
    // a differential one opens on the run compared (B), coloured against the other
    var mi = st.moment === undefined ? (c.diff ? c.diff[1] : 0) : st.moment;
    if (!c.moments[mi]) mi = st.moment = 0;
    var M = c.moments[mi], s = flameSums(c, t, mi);
    var zoom = st.zoom || 0;
    if (!(zoom < t.n && s.bytes[zoom] > 0)) zoom = st.zoom = 0;
    // an image has no controls: its title says the moment
    html('div', 'chart-title', (c.title || c.id) + (pngId ? ', at ' + momentName(M) : ''), fig);
    if (!pngId) {
      var ctl = controls(fig);
      selector(ctl, 'moment', c.moments.map(function (m) {
        return momentName(m) + ': ' + fmtBytes(m.estimated_bytes || 0, 1);
      }), mi, function (i) { st.moment = i; draw(c.id); });
      var reset = html('button', 'reset', 'reset zoom', ctl);
      reset.type = 'button';
      reset.disabled = !zoom;
      reset.addEventListener('click', function () { st.zoom = 0; draw(c.id); });
      if (zoom) html('span', 'zoomed', 'zoomed into ' + t.labels[c.frame[zoom]] + ': click a box above ' +
                     'to go back to it, double-click or reset for the whole', ctl);
    }
    var legend = html('div', 'legend', null, fig);
    var kinds = {};
    c.objects.forEach(function (o) { (kinds[o.kind] = kinds[o.kind] || []).push(o.path.split('/').pop() || '?'); });
    Object.keys(KIND_HSL).forEach(function (k) {
      if (!kinds[k]) return;
      var item = html('span', 'legend-item static', null, legend);
      item.title = kinds[k].join(', ');
      var hsl = KIND_HSL[k];
      html('span', 'sw', null, item).style.background = 'hsl(' + hsl[0] + ',' + hsl[1] + '%,' + hsl[2] + '%)';
      var name = (c.kinds && c.kinds[k]) || k;
      html('span', null, name + (k === 'program' || k === 'runtime' ? ' (' + kinds[k].join(', ') + ')' : ''), item);
    });
    // the byte scale stays above the boxes, which scroll when the paths run deep
    var axisBox = html('div', 'flame-axis', null, fig);
    var box = html('div', 'plotbox' + (pngId ? '' : ' scrolly'), null, fig);
    if (c.note) html('div', 'note', c.note, fig);
    var tip = html('div', 'tip wide', null, fig);
    tip.style.display = 'none';
    var W = Math.max(320, Math.floor(box.clientWidth || fig.clientWidth || 640));
    var total = s.bytes[0];
    if (!(total > 0)) {
      html('div', 'empty', 'No sampled allocation is live at this moment (' + momentName(M) + ').', box);
      sitesTable(c, M, t, s, null);
      return 0;
    }
    var boxes = flameLayout(c, t, s, zoom, W);
    var rows = 0;
    boxes.forEach(function (b) { if (t.depth[b[0]] + 1 > rows) rows = t.depth[b[0]] + 1; });
    var rowH = FLAME_ROW;
    if (pngId) {
      // an image cannot scroll: rows as low as labels allow, deeper paths left out (said)
      var room = Math.max(200, box.clientHeight);
      rowH = Math.max(14, Math.min(FLAME_ROW, Math.floor(room / rows)));
      var fits = Math.floor(room / rowH);
      if (rows > fits) {
        boxes = boxes.filter(function (b) { return t.depth[b[0]] < fits; });
        rows = fits;
        html('div', 'note', 'Call paths deeper than ' + fits + ' calls are left out of this image.', fig);
      }
    }
    var H = rows * rowH;
    var zoomW = s.bytes[zoom];
    // the bytes under the zoomed box, as an axis above the root
    var top = svg('svg', {width: W, height: FLAME_AXIS, viewBox: '0 0 ' + W + ' ' + FLAME_AXIS, 'class': 'plot flame-scale'}, axisBox);
    text(top, W / 2, 12, 'estimated live bytes at ' + momentName(M) +
      (zoom ? ' under ' + t.labels[c.frame[zoom]] : '') + ' \u2022 callers on top, the allocating call at the bottom',
      {'class': 'axis-title', 'text-anchor': 'middle'});
    var ay = FLAME_AXIS - 3, X = scale(0, zoomW, 0, W, false), axis = 'M0 ' + ay + 'H' + W;
    var tv = linTicks(0, zoomW, 'bytes', Math.max(2, Math.round(W / 120))), tl = tickLabels(tv, 'bytes'), lastRight = -Infinity;
    tv.forEach(function (v, i) {
      var x = X(v), w = (tl[i] || '').length * 6.4;
      if (x > W + 0.5) return;
      axis += 'M' + x.toFixed(1) + ' ' + ay + 'v-4';
      var anchor = x - w / 2 < 0 ? 'start' : x + w / 2 > W ? 'end' : 'middle';
      var left = anchor === 'start' ? x : anchor === 'end' ? x - w : x - w / 2;
      if (tl[i] === null || left < lastRight + 8) return;
      lastRight = left + w;
      text(top, x, ay - 8, tl[i], {'class': 'tick tick-x', 'text-anchor': anchor});
    });
    svg('path', {d: axis, 'class': 'axis', fill: 'none'}, top);
    var root = svg('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, 'class': 'plot flame', role: 'img'}, box);
    root.setAttribute('aria-label', (c.title || c.id) + ', ' + momentName(M));
    // boxes and labels are put together off the page, then added at once
    var g = svg('g', {'class': 'boxes'}), lg = svg('g', {'class': 'labels'});
    var measure = measurer(root);
    var rects = [];
    // a differential flame graph (heapsight diff): B's boxes coloured by B - A, beyond the
    // two estimates' 99.9% interval (their 95% errors combined, widened)
    var base = c.diff && mi === c.diff[1] ? flameSums(c, t, c.diff[0]) : null;
    function diffColor(n) {
      var d = s.bytes[n] - base.bytes[n], e = Math.sqrt(s.err2[n] + base.err2[n]) * 3.29 / 1.96;
      if (Math.abs(d) <= e) return 'hsl(210,6%,78%)';
      var f = Math.min(1, Math.abs(d) / Math.max(1, Math.max(s.bytes[n], base.bytes[n])));
      return d > 0 ? 'hsl(0,75%,' + (80 - 30 * f).toFixed(0) + '%)' : 'hsl(215,75%,' + (80 - 30 * f).toFixed(0) + '%)';
    }
    boxes.forEach(function (b) {
      var n = b[0], y = t.depth[n] * rowH;
      var r = svg('rect', {x: b[1].toFixed(2), y: y, width: Math.max(0.5, b[2] - 0.5).toFixed(2),
        height: rowH - 1, fill: base ? diffColor(n) : n ? t.colors[c.frame[n]] : ROOT_COLOR,
        'class': b[3] ? 'fbox anc' : 'fbox', 'data-n': n}, g);
      rects.push(r);
      var name = n ? t.labels[c.frame[n]] : 'all: ' + fmtBytes(total, 1) + ' at ' + String(M.name || '');
      var label = fitLabel(name, b[2] - 8, measure);
      if (label) text(lg, b[1] + 4, y + rowH - 5.5, label, {'class': 'flabel', 'data-w': b[2].toFixed(1)});
    });
    root.appendChild(g);
    root.appendChild(lg);
    fig.dataset.marks = String(rects.length);
    fig.dataset.moment = String(M.name);
    fig.dataset.zoom = zoom ? t.labels[c.frame[zoom]] : '';
    if (!pngId) {
      var over = null;
      function node(ev) {
        var a = ev.target && ev.target.getAttribute && ev.target.getAttribute('data-n');
        return a === null || a === undefined ? -1 : parseInt(a, 10);
      }
      root.addEventListener('mousemove', function (ev) {
        var n = node(ev);
        if (n < 0) { tip.style.display = 'none'; return; }
        var r = root.getBoundingClientRect();
        var rowsT = [], f = n ? c.frames[c.frame[n]] : null;
        if (f) {
          var ls = (f[2] || []).filter(function (v) { return fin(v) && v > 0; });
          if (f[1]) rowsT.push(['', 'source', String(f[1]) + (ls.length ? ':' + ls.join(', ') : '')]);
          var o = c.objects[f[3]] || {};
          rowsT.push(['', 'object', (o.path || 'unknown') + (f[4] ? ' (' + f[4] + ')' : '')]);
        }
        rowsT.push([n ? t.colors[c.frame[n]] : ROOT_COLOR, 'live bytes', bytesPm(s.bytes[n], s.err2[n])]);
        rowsT.push(['', 'share', share(s.bytes[n], total) + ' of the sampled live bytes at ' + String(M.name || '') +
          (zoom && n !== zoom && s.bytes[zoom] >= s.bytes[n] ? ', ' + share(s.bytes[n], s.bytes[zoom]) + ' of the zoomed box' : '')]);
        rowsT.push(['', 'blocks', '\u2248 ' + count(s.blocks[n])]);
        if (base) rowsT.push(['', 'in A', bytesPm(base.bytes[n], base.err2[n]) + ' (' +
          (s.bytes[n] >= base.bytes[n] ? '+' : '\u2212') + fmtBytes(Math.abs(s.bytes[n] - base.bytes[n]), 1) + ')']);
        if (s.own[n] > 0 && n) rowsT.push(['', 'allocated here', fmtBytes(s.own[n], 1) + ' (this call is the innermost)']);
        showTip(fig, tip, root, ev.clientX - r.left, ev.clientY - r.top,
                n ? t.labels[c.frame[n]] : 'all sampled live bytes', rowsT);
      });
      root.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
      root.addEventListener('click', function (ev) {
        var n = node(ev);
        if (n < 0 || n === zoom) return;
        st.zoom = n; tip.style.display = 'none'; draw(c.id);
      });
      root.addEventListener('dblclick', function () {
        if (st.zoom) { st.zoom = 0; tip.style.display = 'none'; draw(c.id); }
      });
    }
    sitesTable(c, M, t, s, rects);
    return rects.length;
  }

  // The top call sites of the chosen moment, beside the flame graph; hovering a row
  // outlines that site's boxes.
  function sitesTable(c, M, t, s, rects) {
    var side = document.getElementById('side-' + c.id);
    if (!side || pngId) return;
    side.textContent = '';
    var SHOW = 20;
    var tb = html('table', 'data sites', null, side);
    html('caption', null, 'Top call sites at ' + momentName(M), tb);
    var hr = html('tr', null, null, html('thead', null, null, tb));
    ['call site', 'live bytes', 'share', 'blocks'].forEach(function (h) { html('th', null, h, hr); });
    var body = html('tbody', null, null, tb);
    (M.sites || []).slice(0, SHOW).forEach(function (r) {
      var tr = html('tr', null, null, body);
      siteCell(tr, r.site);
      html('td', null, fmtBytes(r.bytes || 0, 1) + (r.error_bytes > 0 ? ' \u00b1 ' + fmtBytes(r.error_bytes, 1) : ''), tr);
      html('td', null, fin(r.share) ? fmt(100 * r.share, '%') : '\u2013', tr);
      html('td', null, count(r.blocks), tr);
      if (!rects || r.frame === null || r.frame === undefined) return;
      tr.addEventListener('mouseenter', function () {
        rects.forEach(function (e) { if (c.frame[+e.getAttribute('data-n')] === r.frame) e.classList.add('match'); });
      });
      tr.addEventListener('mouseleave', function () {
        rects.forEach(function (e) { e.classList.remove('match'); });
      });
    });
    var n = M.sites_total || 0;
    var est = fmtBytes(M.estimated_bytes || 0, 1), live = fin(M.live_bytes) ? fmtBytes(M.live_bytes, 1) : null;
    html('p', 'table-note', (n > SHOW ? 'the ' + SHOW + ' largest of ' + count(n) + ' call sites (the JSON has all); ' : '') +
      count(M.samples) + ' samples live, ' + est + ' estimated' + (live ? ' of ' + live + ' live (counted)' : '') +
      '. Hover a row to outline its boxes.', side);
  }

  // ------------------------------------------------------------------ heap map
  // Each arena's heaps, one cell per page or per group of pages (a power of two, the
  // fewest that fit), split by the states of its pages.
  var HEAP_CELL_PX = [14, 10, 7, 5];
  var heapCache = {};
  function unb64(s) {
    var b = atob(s || ''), a = new Uint8Array(b.length);
    for (var i = 0; i < b.length; i++) a[i] = b.charCodeAt(i);
    return a;
  }
  function hex(v) { return '0x' + v.toString(16); }

  function releaseSentence(M) {
    if (!fin(M.release_measured_bytes)) return 'No release was measured with this map.';
    return 'A release in a copy of the process (the program untouched) gave back ' +
      fmtBytes(M.release_measured_bytes, 1) +
      (fin(M.rss_before) && fin(M.rss_after) ? ': its RSS went from ' + fmtBytes(M.rss_before, 1) +
       ' to ' + fmtBytes(M.rss_after, 1) : '') + '.';
  }
  // A cell of several pages is split top to bottom by the share of its pages in each
  // state, a state present at least a pixel high: one pinned page among free ones shows.
  function splitCell(paths, tally, pages, x, y, s) {
    var hs = [], big = -1, sum = 0;
    for (var i = 0; i < tally.length; i++) {
      var h = tally[i] ? Math.max(1, Math.round(s * tally[i] / pages)) : 0;
      hs.push(h); sum += h;
      if (tally[i] && (big < 0 || tally[i] > tally[big])) big = i;
    }
    hs[big] = Math.max(1, hs[big] + s - sum);   // the largest share takes up the rounding
    var bottom = y + s;
    for (i = 0; i < hs.length && y < bottom; i++) {
      if (!hs[i]) continue;
      var hh = Math.min(hs[i], bottom - y);   // more states than pixels: the last ones give way
      paths[i].push('M' + x + ' ' + y + 'h' + s + 'v' + hh + 'h-' + s + 'z');
      y += hh;
    }
  }
  function mapName(M) { return String(M.moment || '?') + (fin(M.t_s) ? ' at ' + fmtSec(M.t_s) : ''); }

  function drawHeapmap(fig, c) {
    var st = state[c.id] = state[c.id] || {};
    var mi = st.map || 0;
    if (!c.maps[mi]) mi = st.map = 0;
    var M = c.maps[mi], states = c.states || [];
    html('div', 'chart-title', (c.title || c.id) + (pngId ? ', at ' + mapName(M) : ''), fig);
    if (c.maps.length > 1 && !pngId) {
      selector(controls(fig), 'map', c.maps.map(mapName), mi, function (i) { st.map = i; draw(c.id); });
    }
    fig.dataset.map = String(M.moment);
    if (M.status !== 'mapped') {
      // the reason, and the release figure: nothing else is known
      var p = html('div', 'empty', null, fig);
      html('p', 'status', 'The heap at ' + mapName(M) + ' is ' + String(M.status || 'not mapped') + '.', p);
      html('p', 'release', releaseSentence(M), p);
      var side0 = document.getElementById('side-' + c.id);
      if (side0) side0.textContent = '';
      fig.dataset.marks = '0';
      return 0;
    }
    var legend = html('div', 'legend', null, fig);
    (M.legend || []).forEach(function (l) {
      if (l.state === 'unwalked' && !l.pages) return;   // a failed walk is listed only when there was one
      var item = html('span', 'legend-item static', null, legend);
      html('span', 'sw', null, item).style.background = l.color;
      html('span', null, l.label + ': ' + fmtBytes(l.bytes, 1), item);
    });
    var box = html('div', 'plotbox', null, fig);
    if (M.note) html('div', 'note', M.note, fig);
    var tip = html('div', 'tip', null, fig);
    tip.style.display = 'none';
    var W = Math.max(320, Math.floor(box.clientWidth || fig.clientWidth || 640));
    var page = M.page_bytes || 4096;
    var key = c.id + '/' + mi;
    var heaps = heapCache[key];
    if (!heaps) {
      heaps = [];
      (M.arenas || []).forEach(function (a, ai) {
        (a.heaps || []).forEach(function (h, hi) {
          heaps.push({arena: a, first: hi === 0, many: (a.heaps || []).length > 1, start: parseInt(h.start, 16),
                      kind: h.kind === 'thread' ? 'thread heap' : h.kind === 'main' ? 'main heap' :
                        h.kind === 'allocator' ? 'mapping' : 'heap',
                      startText: String(h.start), pages: h.pages, states: unb64(h.states), occ: unb64(h.occupancy)});
        });
      });
      heapCache[key] = heaps;
    }
    // the grouping: the fewest pages per cell, then the largest cell, that fit the height
    var ARENA_H = 20, HEAP_H = 16;
    var heads = 0;
    heaps.forEach(function (h) { heads += (h.first ? ARENA_H : 0) + (h.many ? HEAP_H : 0); });
    var CAPTION_H = 22;
    var budget = pngId ? Math.max(120, box.clientHeight - heads - CAPTION_H - 4) : 460;
    var group = 1, cell = HEAP_CELL_PX[HEAP_CELL_PX.length - 1];
    function height(g, px) {
      var cols = Math.floor(W / px), rows = 0;
      heaps.forEach(function (h) { rows += Math.ceil(Math.ceil(h.pages / g) / cols); });
      return rows * px;
    }
    search:
    for (var g = 1; g <= (1 << 24); g *= 2) {
      for (var k = 0; k < HEAP_CELL_PX.length; k++) {
        if (height(g, HEAP_CELL_PX[k]) <= budget) { group = g; cell = HEAP_CELL_PX[k]; break search; }
      }
    }
    var cols = Math.floor(W / cell), s = cell - 1;
    var H = heads + height(group, cell) + 4 + CAPTION_H;
    var root = svg('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, 'class': 'plot heapmap', role: 'img'}, box);
    root.setAttribute('aria-label', (c.title || c.id) + ', ' + mapName(M));
    // the grouping, under the cells: what one cell is
    text(root, 0, H - 6, 'one cell = ' + (group === 1 ? '1 page (' + fmtBytes(page, 1) + ')'
      : count(group) + ' pages (' + fmtBytes(group * page, 1) + '), split by the share of its pages in each state') +
      '; addresses rise left to right, row by row', {'class': 'axis-title'});
    var paths = states.map(function () { return []; });
    var y = 0, cells = 0, blocks = [];
    heaps.forEach(function (h) {
      if (h.first) {
        var a = h.arena;
        // glibc's arenas by number; another allocator's mappings as one group (the hooks'
        // record of them: its own arenas are not told apart)
        var group0 = M.allocator && M.allocator !== 'glibc' ? M.allocator + "'s mappings"
          : 'arena ' + String(a.arena) + (a.arena === 0 ? ' (main)' : '');
        text(root, 0, y + 14, group0 + ': ' +
          count(a.pages) + ' pages, ' + fmtBytes((a.pages || 0) * page, 1) +
          (h.many ? '' : ', ' + h.kind + ' at ' + h.startText), {'class': 'hm-label'});
        y += ARENA_H;
      }
      if (h.many) { text(root, 0, y + 12, h.kind + ' at ' + h.startText + ': ' + count(h.pages) + ' pages', {'class': 'hm-sub'}); y += HEAP_H; }
      var n = Math.ceil(h.pages / group), tally = new Int32Array(states.length);
      for (var j = 0; j < n; j++) {
        tally.fill(0);
        var p0 = j * group, p1 = Math.min(h.pages, p0 + group);
        for (var p = p0; p < p1; p++) tally[h.states[p]]++;
        var cx = (j % cols) * cell, cy = y + Math.floor(j / cols) * cell;
        splitCell(paths, tally, p1 - p0, cx, cy, s);
      }
      cells += n;
      blocks.push({h: h, y0: y, n: n});
      y += Math.ceil(n / cols) * cell;
    });
    var drawn = 0;
    paths.forEach(function (d, i) {
      if (!d.length) return;
      svg('path', {d: d.join(''), fill: states[i].color, 'class': 'cells', 'data-state': states[i].state}, root);
      drawn++;
    });
    fig.dataset.marks = String(drawn);
    fig.dataset.cells = String(cells);
    fig.dataset.group = String(group);
    if (!pngId) {
      root.addEventListener('mousemove', function (ev) {
        var r = root.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
        var b = null;
        blocks.forEach(function (x) { if (py >= x.y0 && py < x.y0 + Math.ceil(x.n / cols) * cell) b = x; });
        var col = Math.floor(px / cell), j = b ? Math.floor((py - b.y0) / cell) * cols + col : -1;
        if (!b || col >= cols || j < 0 || j >= b.n) { tip.style.display = 'none'; return; }
        var h = b.h, p0 = j * group, p1 = Math.min(h.pages, p0 + group), tally = new Int32Array(states.length), occ = 0;
        for (var p = p0; p < p1; p++) { tally[h.states[p]]++; occ += h.occ[p]; }
        var live = occ / 255 * page, pages = p1 - p0;
        var head = fin(h.start) ? hex(h.start + p0 * page) + ' \u2013 ' + hex(h.start + p1 * page) : 'pages ' + p0 + '\u2013' + p1;
        var rowsT = [];
        states.forEach(function (x, i) {
          if (tally[i]) rowsT.push([x.color, x.label, pages > 1 ? count(tally[i]) + ' pages' : '']);
        });
        rowsT.push(['', 'live bytes', '\u2248 ' + fmtBytes(live, 1) + ' (' + share(live, pages * page) + ' of ' +
          (pages > 1 ? count(pages) + ' pages' : 'the page') + ')']);
        showTip(fig, tip, root, px, py, head + ' (' + fmtBytes(pages * page, 1) +
          (M.allocator && M.allocator !== 'glibc' ? ', ' + M.allocator : ', arena ' + String(h.arena.arena)) + ')', rowsT);
      });
      root.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    }
    pinnersTable(c, M);
    return drawn;
  }

  // Beside the map: what a release measured, and the call sites whose live blocks keep
  // otherwise free pages resident.
  function pinnerSite(p) { return p.site ? String(p.site) : 'stack ' + String(p.stack); }
  function pinnersTable(c, M) {
    var side = document.getElementById('side-' + c.id);
    if (!side || pngId) return;
    side.textContent = '';
    html('p', 'release', releaseSentence(M), side);
    if (fin(M.fork_ms) && fin(M.map_ms)) {
      html('p', 'table-note', 'The map and the release were taken in a fork()ed copy: the program waited ' +
        trim(M.fork_ms.toFixed(2)) + ' ms for the fork; the copy took ' + trim(M.map_ms.toFixed(1)) + ' ms.', side);
    }
    var pins = M.pinners || [];
    if (!pins.length) {
      html('p', 'pin-lead', 'No live block keeps an otherwise free page resident.', side);
      return;
    }
    var top = pins[0];
    html('p', 'pin-lead', count(top.blocks) + ' blocks of ' + fmtBytes(top.block_bytes || 0, 1) + ' from ' +
      pinnerSite(top) + ' pin ' + fmtBytes(top.pinned_bytes || 0, 1) + ' that a trim cannot return.', side);
    var tb = html('table', 'data pinners', null, side);
    html('caption', null, 'What pins the heap at ' + mapName(M), tb);
    var hr = html('tr', null, null, html('thead', null, null, tb));
    ['call site', 'live blocks', 'of', 'pin'].forEach(function (h) { html('th', null, h, hr); });
    var body = html('tbody', null, null, tb);
    pins.slice(0, 20).forEach(function (p) {
      var tr = html('tr', null, null, body);
      siteCell(tr, pinnerSite(p));
      html('td', null, count(p.blocks), tr);
      html('td', null, fmtBytes(p.block_bytes || 0, 1), tr);
      html('td', null, fmtBytes(p.pinned_bytes || 0, 1) + (p.error_bytes > 0 ? ' \u00b1 ' + fmtBytes(p.error_bytes, 1) : ''), tr);
    });
    if (pins.length > 20) html('p', 'table-note', 'the 20 largest of ' + count(pins.length) + ' (the JSON has all)', side);
  }

  // ------------------------------------------------------------------ one chart
  function draw(id) {
    var t0 = performance.now();
    try { return drawChart(id); } finally {
      var f = document.getElementById('fig-' + id);
      if (f) f.dataset.ms = String(Math.round(performance.now() - t0));
    }
  }
  function drawChart(id) {
    var c = charts[id];
    var fig = document.getElementById('fig-' + id);
    if (!c || !fig) throw new Error('chart ' + id + ' has no ' + (c ? 'place on the page' : 'data'));
    fig.textContent = '';
    if (c.kind === 'flame' || c.kind === 'heapmap') {
      var made = c.kind === 'flame' ? drawFlame(fig, c) : drawHeapmap(fig, c);
      fig.dataset.drawn = 'yes';
      return made;
    }
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
    var dodged = c.kind === 'line' && (c.series || []).length >= 3 &&
      (c.series || []).every(function (s) { return (s.x || []).length <= 24; });
    var note = (c.note || '') + (dodged ? (c.note ? ' ' : '') + 'Lines that lie on each other ' +
      'are drawn a few pixels apart, into the plot; hover a point for its figure.' : '');
    if (note) html('div', 'note', note, fig);
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
  // no axis repeats a tick label, no two labels overlap, no flame graph label runs out of
  // its box, and the first run's verdict, its breakdown and its first suggestion are in
  // the first screen.
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
    // a flame graph's label never runs past its box (data-w: the box's width)
    var spills = 0;
    document.querySelectorAll('svg.flame text.flabel').forEach(function (t) {
      if (t.getComputedTextLength() > parseFloat(t.getAttribute('data-w')) - 4) spills++;
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
    document.body.dataset.labelSpills = String(spills);
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
