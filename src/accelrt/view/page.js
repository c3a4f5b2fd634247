// accelrt memory picture. Offline: no network, no libraries. Data: a small JSON head and one
// zlib blob of byte-shuffled columns (see accelrt/view/_render.py).
"use strict";
(function () {
const HEAD = JSON.parse(document.getElementById("head").textContent);
const $ = (id) => document.getElementById(id);
const tip = $("tip");
const body = document.body;
const T0 = performance.now();

function fail(err) {
  body.dataset.error = String(err && err.stack || err);
  const p = document.createElement("pre");
  p.textContent = "The picture could not be drawn: " + body.dataset.error;
  document.body.prepend(p);
  throw err;
}

async function inflate(b64) {
  let bytes;
  try {
    bytes = await (await fetch("data:application/octet-stream;base64," + b64)).arrayBuffer();
  } catch (e) {
    const s = atob(b64);
    bytes = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  }
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

const TYPES = { i32: [Int32Array, 4], f64: [Float64Array, 8], u8: [Uint8Array, 1] };
function unpack(raw) {
  const out = {};
  let off = 0;
  for (const [name, type, count, nbytes] of HEAD.layout) {
    if (type === "json") {
      out[name] = JSON.parse(new TextDecoder().decode(raw.subarray(off, off + nbytes)));
    } else {
      const [Ctor, w] = TYPES[type];
      const buf = new Uint8Array(count * w);
      for (let b = 0; b < w; b++) {  // undo the byte shuffle
        const src = off + b * count;
        for (let i = 0, j = b; i < count; i++, j += w) buf[j] = raw[src + i];
      }
      out[name] = new Ctor(buf.buffer);
    }
    off += nbytes;
  }
  return out;
}

// ------------------------------------------------------------------ formatting
const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
function fmt(n) {
  let i = 0, v = n;
  while (Math.abs(v) >= 1024 && i < UNITS.length - 1) { v /= 1024; i++; }
  return i === 0 ? n + " B" : v.toFixed(2) + " " + UNITS[i];
}
function fmtLong(n) { return n < 1024 ? n + " B" : fmt(n) + " (" + n + " bytes)"; }
function hex(a) { return "0x" + a.toString(16); }
function fmtTime(us) {
  const a = Math.abs(us);
  if (a >= 6e7) return (us / 6e7).toFixed(2) + " min";
  if (a >= 1e6) return (us / 1e6).toFixed(a >= 1e7 ? 1 : 2) + " s";
  if (a >= 1e3) return (us / 1e3).toFixed(a >= 1e4 ? 1 : 2) + " ms";
  return us.toFixed(0) + " µs";
}
function niceStep(range, n) {
  const raw = range / Math.max(1, n);
  const p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-9))));
  const m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}
function niceBytes(range, n) {
  const raw = range / Math.max(1, n);
  let unit = 1;
  while (raw / unit >= 1024) unit *= 1024;
  const m = raw / unit;
  const step = m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32
    : m <= 64 ? 64 : m <= 128 ? 128 : m <= 256 ? 256 : 512;
  return step * unit;
}
function el(tag, attrs, parent, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function hue(i) { return (i * 137.508) % 360; }

// ------------------------------------------------------------------ tooltip
function showTip(e, text) {
  tip.textContent = text;
  tip.style.display = "block";
  const w = tip.offsetWidth, h = tip.offsetHeight;
  const vw = window.innerWidth, vh = window.innerHeight;
  let x = e.clientX + 14, y = e.clientY + 14;
  if (x + w > vw - 4) x = Math.max(4, e.clientX - 14 - w);
  if (y + h > vh - 4) y = Math.max(4, vh - 4 - h);
  tip.style.left = x + "px"; tip.style.top = y + "px";
}
function hideTip() { tip.style.display = "none"; }

async function main() {
  const raw = await inflate($("blob").textContent);
  const D = unpack(raw);
  const META = D.meta;
  // each moment names its segment rows by index: a row unchanged between moments is sent once
  for (const m of META.moments) m.segments = m.segments.map((r) => META.rows[r]);
  const E = HEAD.events, N = HEAD.n;
  const NOHIST = HEAD.history === false;  // a snapshot of the end state only: no events
  const size = D.size, addr = D.addr, stackOf = D.stack, opOf = D.op, streamOf = D.stream;
  const groupOf = D.group;  // per allocation: its frame group (see View.frame_groups), -1 none
  const start = new Int32Array(N), end = new Int32Array(N);
  for (let i = 0, s = 0; i < N; i++) { s += D.start[i]; start[i] = s; end[i] = s + D.dur[i]; }
  const times = D.times ? new Float64Array(D.times.length) : null;
  if (times) for (let i = 0, t = 0; i < times.length; i++) { t += D.times[i]; times[i] = t; }
  const kind = D.kind;
  // per state: the allocation that starts / ends there
  const startsAt = new Int32Array(E + 2).fill(-1), endsAt = new Int32Array(E + 2).fill(-1);
  const delta = new Float64Array(E + 2);
  for (let i = 0; i < N; i++) {
    if (start[i] > 0) startsAt[start[i]] = i;
    if (end[i] <= E) endsAt[end[i]] = i;
    delta[start[i]] += size[i]; delta[end[i]] -= size[i];
  }
  const total = new Float64Array(E + 1);
  let peakState = 0;
  for (let s = 0, run = 0; s <= E; s++) {
    run += delta[s]; total[s] = run;
    if (run > total[peakState]) peakState = s;
  }
  const peakBytes = total[peakState];
  const stacks = META.stacks, ops = META.ops, ooms = META.ooms, moments = META.moments;
  const streams = META.streams, groupNames = META.groups;

  function eventText(e) {
    return times ? "event " + e + " (" + fmtTime(times[Math.min(Math.max(e, 0), times.length - 1)]) + ")"
      : "event " + e;
  }
  function stackLines(id, all) {
    if (id < 0) return [];
    const [py, cpp, hidden] = stacks[id];
    const shown = all ? cpp : cpp.slice(0, 2);
    const lines = py.map((f) => "  " + f).concat(shown.map((f) => "  [C++] " + f));
    const folded = cpp.length - shown.length;
    if (folded > 0 || hidden > 0) {
      lines.push("  ... " + (folded > 0 ? folded + " more C++ frames folded, " : "") +
        hidden + " allocator/dispatcher/interpreter frames hidden");
    }
    return lines;
  }
  function topFrame(id) {
    if (id < 0) return "(no stack)";
    const [py, cpp] = stacks[id];
    return py.length ? py[0] : cpp.length ? cpp[0] : "(no stack)";
  }
  function allocText(i, all) {
    const lines = [fmtLong(size[i]) + "   allocation #" + i];
    if (opOf[i] >= 0) lines.push("op: " + ops[opOf[i]]);
    lines.push("address " + hex(addr[i]) + ", stream " + streams[streamOf[i]]);
    lines.push((start[i] === 0 ? "live before recording began" : "allocated at " + eventText(start[i] - 1)) +
      (end[i] <= E ? ", freed at " + eventText(end[i] - 1) : ", never freed"));
    const st = stackLines(stackOf[i], all);
    if (st.length) { lines.push(stacks[stackOf[i]][0].length ? "stack (Python frames first):" : "stack:"); lines.push(...st); }
    else lines.push("(no stack recorded)");
    return lines.join("\n");
  }

  // ---------------------------------------------------------------- summary, banner
  $("summary").textContent = E + " events, " + N + " allocations; peak live " + fmtLong(peakBytes) +
    " at " + eventText(peakState - 1) + "; " + ooms.length + " OOM" + (ooms.length === 1 ? "" : "s") +
    (HEAD.source ? "; segment maps: " + HEAD.source : "");
  if (NOHIST) endStateOnly();
  else if (HEAD.notes.length) {
    for (const id of ["banner", "seg-banner"]) {
      const b = $(id);
      b.textContent = "About this replay of the recording: " + HEAD.notes.join("; ");
      b.hidden = false;
    }
  }

  // recorded without history: say so, show what the end state holds, hide what needs events
  function endStateOnly() {
    const segs = moments.length ? moments[0].segments : [];
    const count = [0, 0, 0, 0], held = [0, 0, 0, 0];
    let reserved = 0;
    for (const [, total_, , , blocks] of segs) {
      reserved += total_;
      for (const [bsize, state] of blocks) { count[state]++; held[state] += bsize; }
    }
    const blocks = (k) => count[k] + " block" + (count[k] === 1 ? "" : "s");
    $("summary").textContent = "The allocator's state at the end: " + segs.length + " segments, " +
      fmt(reserved) + " reserved; allocated " + fmt(held[0]) + " in " + blocks(0) + " (requested " +
      fmt(peakBytes) + "), pending free " + fmt(held[1]) + " in " + blocks(1) + ", free (cached) " +
      fmt(held[2]) + " in " + blocks(2) + (count[3] ? ", unmapped " + fmt(held[3]) : "");
    const b = $("banner");
    b.textContent = "This snapshot was recorded without allocation history " +
      "(torch.cuda.memory._record_memory_history() was not running): it holds the allocator's " +
      "end state only, so there is nothing over time, no peak and no OOM. Below: what was " +
      "allocated at the end, by stack, and the segment map.";
    b.hidden = false;
    $("over-time").hidden = true;
    $("events").hidden = true;
  }

  // ---------------------------------------------------------------- timeline
  const canvas = $("timeline"), ctx = canvas.getContext("2d");
  const mini = $("minimap"), mctx = mini.getContext("2d");
  const M = { l: 84, r: 14, t: 12, b: 46 };
  let W = 0, H = 0, PW = 0, PH = 0;
  let v0 = 0, v1 = E;  // states shown
  let selected = peakState;  // selected state
  let sx0 = null, sx1 = null, sst = null, nSamples = 0, ymax = 1, minBytes = 0;
  let drawnSet = new Set(), base = null;
  // what colours and groups the allocations: the top frame of their stack, their op, or the
  // kind of memory inferred for them (a "cat" column, where the page was given kinds)
  const kindNames = META.categories || [], catOf = D.cat || null;
  const MODES = {
    stack: { of: (i) => groupOf[i], names: groupNames, none: "(no stack)", label: "stack frame" },
    op: { of: (i) => opOf[i], names: ops, none: "(no op)", label: "op" },
    kind: { of: (i) => catOf[i], names: kindNames, none: "(unknown)", label: "kind" },
  };
  if (!catOf) $("color-by").querySelector("option[value=kind]").remove();
  let colorBy = ops.length && !groupNames.length ? "op" : "stack";
  $("color-by").value = colorBy;
  const K = 2500;  // at most this many allocations drawn one by one
  const BANDS = 40;  // at most this many groups drawn as their own band (the rest share one)
  let isDrawn = new Uint8Array(N), lows = new Map(), drawGen = 0;
  let nBands = 0, bandKey = [], bandVal = null, bandCnt = null, aggTop = null;

  function resize(cv, h) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(600, cv.clientWidth || 1000);
    cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr);
    cv.getContext("2d").setTransform(dpr, 0, 0, dpr, 0, 0);
    return w;
  }
  const X = (s) => M.l + (s - v0) * PW / (v1 - v0 + 1);  // left edge of state s
  const Y = (b) => M.t + PH - PH * b / ymax;
  // the group of an allocation: its op, or the top frame of its stack (-1: none)
  function keyOf(i) { return MODES[colorBy].of(i); }
  function keyName(key) { const m = MODES[colorBy]; return key >= 0 ? m.names[key] : m.none; }
  function colour(i) {
    const key = keyOf(i);
    return "hsl(" + hue(key >= 0 ? key + 1 : i) + ",58%," + (key >= 0 ? 60 : 72) + "%)";
  }
  function bandColour(j) {
    const key = bandKey[j];
    return key >= 0 ? "hsl(" + hue(key + 1) + ",42%,76%)" : key === -1 ? "#d4d4d4" : "#bdbdbd";
  }
  function bandName(j) {
    const key = bandKey[j];
    return key >= -1 ? keyName(key) : "(" + (-key - 1) + " smaller groups together)";
  }

  function sample() {
    const n = v1 - v0 + 1;
    const cols = Math.max(1, Math.floor(PW));
    if (n <= cols) {
      nSamples = n;
      sx0 = new Float64Array(n); sx1 = new Float64Array(n); sst = new Int32Array(n);
      for (let k = 0; k < n; k++) { sst[k] = v0 + k; sx0[k] = X(v0 + k); sx1[k] = X(v0 + k + 1); }
    } else {
      nSamples = cols;
      sx0 = new Float64Array(cols); sx1 = new Float64Array(cols); sst = new Int32Array(cols);
      for (let c = 0; c < cols; c++) {
        const a = v0 + Math.floor(c * n / cols), b = Math.max(a, v0 + Math.floor((c + 1) * n / cols) - 1);
        let best = a;
        for (let s = a + 1; s <= b; s++) if (total[s] > total[best]) best = s;
        sst[c] = best; sx0[c] = M.l + c * PW / cols; sx1[c] = M.l + (c + 1) * PW / cols;
      }
    }
    ymax = 1;
    for (let k = 0; k < nSamples; k++) if (total[sst[k]] > ymax) ymax = total[sst[k]];
    ymax *= 1.05;
  }

  // a Fenwick tree over allocations (stacking order) holding the sizes of the live drawn ones
  function fenwickAt(state) {
    const f = new Float64Array(N + 1);
    for (let i = 0; i < N; i++) if (isDrawn[i] && start[i] <= state && end[i] > state) f[i + 1] = size[i];
    for (let i = 1; i <= N; i++) { const j = i + (i & -i); if (j <= N) f[j] += f[i]; }
    return f;
  }
  function fenAdd(f, i, v) { for (let j = i + 1; j <= N; j += j & -j) f[j] += v; }
  function fenPrefix(f, i) { let s = 0; for (let j = i; j > 0; j -= j & -j) s += f[j]; return s; }
  let LOG = 1; while ((LOG << 1) <= N) LOG <<= 1;
  function fenFind(f, b) {  // the allocation whose [lower, lower + size) holds byte b
    let pos = 0, rest = b;
    for (let step = LOG; step > 0; step >>= 1) {
      const nxt = pos + step;
      if (nxt <= N && f[nxt] <= rest) { pos = nxt; rest -= f[nxt]; }
    }
    return pos < N ? pos : -1;
  }
  function advance(f, from, to) {
    for (let s = from + 1; s <= to; s++) {
      const a = startsAt[s]; if (a >= 0 && isDrawn[a]) fenAdd(f, a, size[a]);
      const d = endsAt[s]; if (d >= 0 && isDrawn[d]) fenAdd(f, d, -size[d]);
    }
  }

  // The live allocations not drawn one by one, summed by group at each sampled state: the
  // BANDS - 1 groups with the most bytes at some sampled state get a band each, the rest one.
  function aggregate(first) {
    const G = MODES[colorBy].names.length + 1;  // slot 0: no group
    const sum = new Float64Array(G), cnt = new Int32Array(G), peak = new Float64Array(G);
    for (let i = 0; i < N; i++) {
      if (!isDrawn[i] && start[i] <= first && end[i] > first) { const g = keyOf(i) + 1; sum[g] += size[i]; cnt[g]++; }
    }
    const walk = (visit) => {  // sums at each sampled state, from the state `first`
      const bs = sum.slice(), bc = cnt.slice();
      for (let k = 0, s = first; k < nSamples && s <= E + 1; s++) {
        if (s > first) {
          const a = startsAt[s]; if (a >= 0 && !isDrawn[a]) { const g = keyOf(a) + 1; bs[g] += size[a]; bc[g]++; }
          const d = endsAt[s]; if (d >= 0 && !isDrawn[d]) { const g = keyOf(d) + 1; bs[g] -= size[d]; bc[g]--; }
        }
        if (s === sst[k]) visit(k++, bs, bc);
      }
    };
    const touched = [];
    walk((k, bs) => { for (let g = 0; g < G; g++) if (bs[g] > peak[g]) peak[g] = bs[g]; });
    for (let g = 0; g < G; g++) if (peak[g] > 0) touched.push(g);
    touched.sort((a, b) => peak[b] - peak[a]);
    const own = touched.length <= BANDS ? touched : touched.slice(0, BANDS - 1);
    const bandOf = new Int32Array(G).fill(own.length);
    own.forEach((g, j) => { bandOf[g] = j; });
    bandKey = own.map((g) => g - 1);
    if (own.length < touched.length) bandKey.push(-(touched.length - own.length) - 1);
    nBands = bandKey.length;
    bandVal = new Float64Array(nBands * nSamples); bandCnt = new Int32Array(nBands * nSamples);
    aggTop = new Float64Array(nSamples);
    walk((k, bs, bc) => {
      for (const g of touched) {
        const j = bandOf[g];
        bandVal[j * nSamples + k] += bs[g]; bandCnt[j * nSamples + k] += bc[g];
        aggTop[k] += bs[g];
      }
    });
  }

  function drawAxes() {
    ctx.strokeStyle = "#888"; ctx.fillStyle = "#333"; ctx.lineWidth = 1;
    ctx.font = "11px system-ui, sans-serif";
    ctx.beginPath(); ctx.moveTo(M.l, M.t); ctx.lineTo(M.l, M.t + PH); ctx.lineTo(M.l + PW, M.t + PH); ctx.stroke();
    const ystep = niceBytes(ymax, 5);
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (let b = 0; b <= ymax; b += ystep) {
      const y = Y(b);
      ctx.strokeStyle = "#e4e4e4"; ctx.beginPath(); ctx.moveTo(M.l + 1, y); ctx.lineTo(M.l + PW, y); ctx.stroke();
      ctx.fillText(fmt(b), M.l - 6, y);
    }
    const xstep = Math.max(1, niceStep(v1 - v0 + 1, Math.max(2, Math.floor(PW / 110))));
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    for (let s = Math.ceil(v0 / xstep) * xstep; s <= v1 + 1; s += xstep) {
      const x = X(s);
      if (x > M.l + PW + 1) break;
      ctx.strokeStyle = "#888"; ctx.beginPath(); ctx.moveTo(x, M.t + PH); ctx.lineTo(x, M.t + PH + 4); ctx.stroke();
      ctx.fillText(String(s), x, M.t + PH + 6);
      if (times && s >= 1 && s <= times.length) { ctx.fillStyle = "#777"; ctx.fillText(fmtTime(times[s - 1]), x, M.t + PH + 19); ctx.fillStyle = "#333"; }
    }
    ctx.textAlign = "left";
    ctx.fillText(times ? "events (index; time since the first event below)" : "events (index)", M.l + PW - 300, M.t + PH + 32);
    ctx.save(); ctx.translate(12, M.t + PH / 2); ctx.rotate(-Math.PI / 2); ctx.textAlign = "center";
    ctx.fillText("live bytes", 0, 0); ctx.restore();
  }

  function draw() {
    const t = performance.now();
    W = resize(canvas, 440); H = 440; PW = W - M.l - M.r; PH = H - M.t - M.b;
    ctx.clearRect(0, 0, W, H);
    sample();
    minBytes = ymax * 2 / PH;
    // the allocations big enough to see, one by one (the K largest of them)
    let chosen = [];
    const first = sst[0], last = sst[nSamples - 1];
    for (let i = 0; i < N; i++) {
      if (size[i] < minBytes || start[i] > last || end[i] <= first) continue;
      let lo = 0, hi = nSamples;  // is it live at a sampled state?
      while (lo < hi) { const mid = (lo + hi) >> 1; if (sst[mid] < start[i]) lo = mid + 1; else hi = mid; }
      if (lo < nSamples && sst[lo] < end[i]) chosen.push(i);
    }
    if (chosen.length > K) { chosen.sort((a, b) => size[b] - size[a]); chosen = chosen.slice(0, K); chosen.sort((a, b) => a - b); }
    isDrawn = new Uint8Array(N);
    for (const i of chosen) isDrawn[i] = 1;
    drawGen++;
    // the rest, summed by group: one band per group at the bottom, largest group lowest
    aggregate(first);
    const lower = new Float64Array(nSamples);
    for (let j = 0; j < nBands; j++) {
      const o = j * nSamples;
      ctx.beginPath(); ctx.moveTo(sx0[0], Y(lower[0]));
      for (let k = 0; k < nSamples; k++) { const y = Y(lower[k]); ctx.lineTo(sx0[k], y); ctx.lineTo(sx1[k], y); }
      for (let k = nSamples - 1; k >= 0; k--) { lower[k] += bandVal[o + k]; const y = Y(lower[k]); ctx.lineTo(sx1[k], y); ctx.lineTo(sx0[k], y); }
      ctx.closePath(); ctx.fillStyle = bandColour(j); ctx.fill();
    }
    // the chosen ones above the bands, in allocation order
    const f = fenwickAt(first);
    let cur = first, ptr = 0, active = [];
    lows = new Map();
    for (let k = 0; k < nSamples; k++) {
      const s = sst[k];
      advance(f, cur, s); cur = s;
      while (ptr < chosen.length && start[chosen[ptr]] <= s) active.push(chosen[ptr++]);
      active = active.filter((i) => end[i] > s);
      for (const i of active) {
        if (start[i] > s) continue;
        let rec = lows.get(i);
        if (!rec) { rec = { k0: k, lo: [] }; lows.set(i, rec); }
        rec.lo.push(aggTop[k] + fenPrefix(f, i));
      }
    }
    drawnSet = new Set();
    for (const [i, rec] of lows) {
      const lo = rec.lo, k0 = rec.k0, n = lo.length;
      ctx.beginPath();
      ctx.moveTo(sx0[k0], Y(lo[0]));
      for (let j = 0; j < n; j++) { const y = Y(lo[j]); ctx.lineTo(sx0[k0 + j], y); ctx.lineTo(sx1[k0 + j], y); }
      for (let j = n - 1; j >= 0; j--) { const y = Y(lo[j] + size[i]); ctx.lineTo(sx1[k0 + j], y); ctx.lineTo(sx0[k0 + j], y); }
      ctx.closePath();
      ctx.fillStyle = colour(i); ctx.fill();
      if (size[i] * PH / ymax > 6) { ctx.strokeStyle = "rgba(255,255,255,.7)"; ctx.lineWidth = 0.5; ctx.stroke(); }
      drawnSet.add(i);
    }
    // OOMs and the peak
    ctx.textBaseline = "top"; ctx.font = "bold 11px system-ui, sans-serif";
    for (const o of ooms) {
      const s = o.event + 1;
      if (s < v0 || s > v1 + 1) continue;
      const x = X(s);
      ctx.strokeStyle = "#d00"; ctx.lineWidth = 2; ctx.setLineDash([]);
      ctx.beginPath(); ctx.moveTo(x, M.t); ctx.lineTo(x, M.t + PH); ctx.stroke();
      ctx.fillStyle = "#d00"; ctx.beginPath(); ctx.moveTo(x - 6, M.t); ctx.lineTo(x + 6, M.t); ctx.lineTo(x, M.t + 9); ctx.fill();
      ctx.fillText("OOM " + fmt(o.size), Math.min(x + 8, M.l + PW - 90), M.t + 2);
    }
    if (peakState >= v0 && peakState <= v1) {
      const x = X(peakState);
      ctx.strokeStyle = "#555"; ctx.lineWidth = 1; ctx.setLineDash([2, 3]);
      ctx.beginPath(); ctx.moveTo(x, M.t); ctx.lineTo(x, M.t + PH); ctx.stroke(); ctx.setLineDash([]);
      ctx.fillStyle = "#333"; ctx.font = "11px system-ui, sans-serif";
      ctx.fillText("peak " + fmt(peakBytes), Math.min(x + 4, M.l + PW - 110), M.t + 16);
    }
    drawAxes();
    base = document.createElement("canvas");
    base.width = canvas.width; base.height = canvas.height;
    base.getContext("2d").drawImage(canvas, 0, 0);
    drawCursor();
    drawMinimap();
    $("range").textContent = "events " + Math.max(0, v0 - 1) + " to " + Math.max(0, v1 - 1) + " of " + E +
      "; " + drawnSet.size + " allocations drawn one by one, smaller ones summed in " + nBands + " band" +
      (nBands === 1 ? "" : "s") + " by " + MODES[colorBy].label + " (at the bottom)";
    body.dataset.drawn = String(drawnSet.size);
    body.dataset.bands = String(nBands);
    body.dataset.view = v0 + "-" + v1;
    body.dataset.drawMs = String(Math.round(performance.now() - t));
  }
  function drawCursor() {
    if (!base) return;
    ctx.save(); ctx.setTransform(1, 0, 0, 1, 0, 0); ctx.drawImage(base, 0, 0); ctx.restore();
    if (selected >= v0 && selected <= v1 + 1) {
      const x = X(selected);
      ctx.strokeStyle = "#000"; ctx.lineWidth = 1; ctx.setLineDash([5, 3]);
      ctx.beginPath(); ctx.moveTo(x, M.t); ctx.lineTo(x, M.t + PH); ctx.stroke(); ctx.setLineDash([]);
    }
  }

  // minimap: the whole run, max per pixel, and the window shown
  let miniCols = null, miniW = 0;
  function drawMinimap() {
    miniW = resize(mini, 70);
    const w = miniW - M.l - M.r, h = 60;
    if (!miniCols || miniCols.length !== Math.floor(w)) {
      miniCols = new Float64Array(Math.max(1, Math.floor(w)));
      for (let s = 0; s <= E; s++) {
        const c = Math.min(miniCols.length - 1, Math.floor(s * miniCols.length / (E + 1)));
        if (total[s] > miniCols[c]) miniCols[c] = total[s];
      }
    }
    mctx.clearRect(0, 0, miniW, 70);
    const top = Math.max(1, peakBytes);
    mctx.fillStyle = "#9aa7c0";
    for (let c = 0; c < miniCols.length; c++) {
      const bh = h * miniCols[c] / top;
      mctx.fillRect(M.l + c, 5 + h - bh, 1, bh);
    }
    for (const o of ooms) { mctx.fillStyle = "#d00"; mctx.fillRect(M.l + (o.event + 1) * w / (E + 1) - 1, 0, 2, 70); }
    const a = M.l + v0 * w / (E + 1), b = M.l + (v1 + 1) * w / (E + 1);
    mctx.fillStyle = "rgba(74,123,208,.18)"; mctx.fillRect(a, 0, Math.max(2, b - a), 70);
    mctx.strokeStyle = "#4a7bd0"; mctx.strokeRect(a, 0.5, Math.max(2, b - a), 69);
    mctx.fillStyle = "#333"; mctx.font = "11px system-ui, sans-serif"; mctx.textBaseline = "middle";
    mctx.fillText("whole run", 6, 35);
  }

  function setView(a, b) {
    const n = Math.max(2, Math.min(E + 1, b - a + 1));
    const m = Math.round(n);
    a = Math.round(Math.max(0, Math.min(a, E + 1 - m)));
    v0 = a; v1 = Math.min(E, a + m - 1);
    draw();
  }
  function zoomAt(state, factor) {
    const n = (v1 - v0 + 1) * factor;
    const frac = (state - v0) / (v1 - v0 + 1);
    setView(state - frac * n, state - frac * n + n - 1);
  }
  function stateAtX(x) { return v0 + (x - M.l) * (v1 - v0 + 1) / PW; }
  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = canvas.getBoundingClientRect();
    zoomAt(stateAtX(e.clientX - r.left), e.deltaY < 0 ? 0.7 : 1 / 0.7);
  }, { passive: false });
  let drag = null;
  canvas.addEventListener("mousedown", (e) => { drag = { x: e.clientX, v0: v0, v1: v1, moved: false }; });
  window.addEventListener("mouseup", () => { drag = null; });
  canvas.addEventListener("dblclick", () => setView(0, E));
  $("zoom-in").onclick = () => zoomAt((v0 + v1) / 2, 0.5);
  $("zoom-out").onclick = () => zoomAt((v0 + v1) / 2, 2);
  $("reset").onclick = () => setView(0, E);
  $("color-by").onchange = (e) => { colorBy = e.target.value; draw(); };

  let hoverFen = null, hoverState = -1, hoverGen = -1;
  function hitTimeline(e) {
    const r = canvas.getBoundingClientRect();
    const x = e.clientX - r.left, y = e.clientY - r.top;
    if (x < M.l || x > M.l + PW || y < M.t || y > M.t + PH) return null;
    for (const o of ooms) if (Math.abs(X(o.event + 1) - x) <= 4) return { oom: o };
    let lo = 0, hi = nSamples - 1;
    while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (sx0[mid] <= x) lo = mid; else hi = mid - 1; }
    const s = sst[lo], k = lo;
    const b = (M.t + PH - y) * ymax / PH;
    if (b >= total[s]) return { state: s, alloc: -1 };
    if (b < aggTop[k]) {  // in a band: which group
      for (let j = 0, acc = 0; j < nBands; j++) {
        acc += bandVal[j * nSamples + k];
        if (b < acc) return { state: s, alloc: -1, band: j, col: k };
      }
    }
    if (hoverState !== s || hoverGen !== drawGen) { hoverFen = fenwickAt(s); hoverState = s; hoverGen = drawGen; }
    return { state: s, alloc: fenFind(hoverFen, b - aggTop[k]) };
  }
  function oomText(o) {
    const lines = ["OUT OF MEMORY (" + o.source + (o.source === "recorded" && o.replayed === false ? "; the replay did not run out" : "") + ")",
      "at " + eventText(o.event) + ": requested " + fmtLong(o.size),
      "free on the device: " + (o.free === null ? "unknown" : fmtLong(o.free)),
      "reserved: " + (o.reserved === null ? "unknown" : fmtLong(o.reserved)) + ", live then: " + fmtLong(o.live)];
    const st = stackLines(o.stack, false);
    if (st.length) { lines.push("stack of the failed request:"); lines.push(...st); }
    return lines.join("\n");
  }
  function hoverText(h) {
    if (h.oom) return oomText(h.oom);
    const head = "after " + eventText(h.state - 1) + ": " + fmt(total[h.state]) + " live";
    if (h.band !== undefined) {
      const o = h.band * nSamples + h.col, c = bandCnt[o];
      return MODES[colorBy].label + ": " + bandName(h.band) + "\n" + c + " allocation" +
        (c === 1 ? "" : "s") + ", " + fmtLong(bandVal[o]) + " live, each too small to draw at this zoom" +
        "\n(zoom in to see them one by one)\n\n" + head;
    }
    if (h.alloc < 0) return head;
    return allocText(h.alloc, false) + "\n\n" + head;
  }
  canvas.addEventListener("mousemove", (e) => {
    if (drag) {
      const dx = e.clientX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      if (drag.moved) {
        const per = (drag.v1 - drag.v0 + 1) / PW;
        setView(drag.v0 - dx * per, drag.v1 - dx * per);
        hideTip();
        return;
      }
    }
    const h = hitTimeline(e);
    if (!h) { hideTip(); return; }
    canvas.dataset.hover = h.oom ? "oom" : h.band !== undefined ? "band:" + bandName(h.band)
      : h.alloc >= 0 ? String(h.alloc) : "";
    showTip(e, hoverText(h));
  });
  canvas.addEventListener("mouseleave", hideTip);
  canvas.addEventListener("click", (e) => {
    if (drag && drag.moved) return;
    const h = hitTimeline(e);
    if (!h) return;
    const d = $("details");
    d.style.display = "block";
    d.textContent = h.oom ? oomText(h.oom) : h.alloc >= 0 ? allocText(h.alloc, true) : hoverText(h);
    select(h.oom ? h.oom.event + 1 : h.state);
  });
  let brush = null;
  function miniState(e) {
    const r = mini.getBoundingClientRect();
    return Math.max(0, Math.min(E, Math.round((e.clientX - r.left - M.l) * (E + 1) / (miniW - M.l - M.r))));
  }
  mini.addEventListener("mousedown", (e) => { brush = miniState(e); });
  mini.addEventListener("mouseup", (e) => {
    if (brush === null) return;
    const s = miniState(e);
    if (Math.abs(s - brush) < 4) { const n = v1 - v0 + 1; setView(s - n / 2, s + n / 2); }
    else setView(Math.min(s, brush), Math.max(s, brush));
    brush = null;
  });
  mini.addEventListener("mousemove", (e) => {
    showTip(e, "after " + eventText(miniState(e) - 1) + ": " + fmt(total[miniState(e)]) + " live\ndrag to choose a range, click to centre");
  });
  mini.addEventListener("mouseleave", hideTip);

  // ---------------------------------------------------------------- OOM table
  const oomBody = $("ooms");
  if (!ooms.length) { $("no-ooms").hidden = false; $("ooms").hidden = true; }
  ooms.forEach((o, n) => {
    const tr = el("tr", { class: "clickable oom-row" }, oomBody);
    el("td", { class: "num" }, tr, String(n + 1));
    el("td", {}, tr, o.source + (o.source === "recorded" && o.replayed === false ? " (replay fits)" : ""));
    el("td", { class: "num" }, tr, String(o.event));
    el("td", { class: "num" }, tr, fmt(o.size));
    el("td", { class: "num" }, tr, o.free === null ? "?" : fmt(o.free));
    el("td", { class: "num" }, tr, o.reserved === null ? "?" : fmt(o.reserved));
    el("td", { class: "num" }, tr, fmt(o.live));
    const td = el("td", {}, tr);
    const det = el("details", {}, td);
    el("summary", {}, det, topFrame(o.stack));
    el("pre", {}, det, stackLines(o.stack, true).join("\n") || "(no stack recorded)");
    tr.addEventListener("click", (e) => {
      if (e.target.tagName === "SUMMARY" || e.target.tagName === "PRE") return;
      const n2 = Math.max(64, (v1 - v0 + 1) / 4);
      setView(o.event + 1 - n2 / 2, o.event + 1 + n2 / 2);
      select(o.event + 1);
    });
  });

  // ---------------------------------------------------------------- live tables
  const liveAt = $("live-at");
  if (NOHIST) el("option", { value: "0" }, liveAt, "at the end");
  else el("option", { value: "selected" }, liveAt, "at the selected event");
  if (!NOHIST) el("option", { value: String(peakState) }, liveAt, "at the peak (" + eventText(peakState - 1) + ")");
  ooms.forEach((o, n) => el("option", { value: String(o.event) }, liveAt, "at OOM " + (n + 1) + " (" + eventText(o.event) + ")"));
  liveAt.value = NOHIST ? "0" : ooms.length ? String(ooms[0].event) : String(peakState);
  function groups(state, mode) {
    const sums = new Map(), m = MODES[mode];
    for (let i = 0; i < N; i++) {
      if (start[i] > state || end[i] <= state) continue;
      const k = m.of(i), key = k >= 0 ? m.names[k] : m.none;
      const g = sums.get(key) || [0, 0];
      g[0] += size[i]; g[1] += 1; sums.set(key, g);
    }
    return [...sums.entries()].sort((a, b) => b[1][0] - a[1][0]).slice(0, 25);
  }
  function fillLive() {
    const state = liveAt.value === "selected" ? selected : +liveAt.value;
    const live = total[Math.min(E, state)];
    const tables = [["live-frame", "stack", "innermost Python frame (else C++ frame)"], ["live-op", "op", "op"]];
    if (catOf) tables.push(["live-kind", "kind", "kind of memory (inferred; see docs/viewer.md)"]);
    for (const [id, mode, heading] of tables) {
      const t = $(id);
      t.textContent = "";
      const hr = el("tr", {}, t);
      el("th", {}, hr, heading);
      el("th", { class: "num" }, hr, "live bytes"); el("th", { class: "num" }, hr, "share");
      el("th", { class: "num" }, hr, "allocations");
      const rows = groups(Math.min(E, state), mode);
      if (mode === "op" && !ops.length) { el("td", { colspan: 4 }, el("tr", {}, t), "this input records no op names"); continue; }
      for (const [key, [b, c]] of rows) {
        const tr = el("tr", {}, t);
        el("td", {}, tr, key); el("td", { class: "num" }, tr, fmt(b));
        el("td", { class: "num" }, tr, (live ? 100 * b / live : 0).toFixed(1) + "%");
        el("td", { class: "num" }, tr, String(c));
      }
    }
  }
  liveAt.onchange = fillLive;

  // ---------------------------------------------------------------- event list
  const list = $("events"), spacer = $("events-spacer");
  const ROW = 18;
  spacer.style.height = (E * ROW) + "px";
  const KINDS = ["alloc", "free", "empty_cache", "OOM"];
  const oomAt = new Map(ooms.map((o) => [o.event, o]));
  function eventLabel(e) {
    const k = kind[e];
    const o = oomAt.get(e);
    let text = "#" + e + " " + (o ? "OOM" : KINDS[k]);
    if (times) text += " +" + fmtTime(times[e]);
    if (o) return text + " " + fmt(o.size) + " (" + o.source + ")";
    let i = -1;
    if (k === 0 && e + 1 <= E) i = startsAt[e + 1];
    if (k === 1) i = endsAt[e + 1];
    if (i >= 0) {
      text += " " + fmt(size[i]) + " " + hex(addr[i]);
      if (opOf[i] >= 0) text += " " + ops[opOf[i]];
      else if (stackOf[i] >= 0) text += " " + topFrame(stackOf[i]).split("  ")[0];
    }
    return text;
  }
  function renderList() {
    const first = Math.floor(list.scrollTop / ROW), n = Math.ceil(list.clientHeight / ROW) + 1;
    for (const r of [...list.querySelectorAll(".row")]) r.remove();
    for (let e = first; e < Math.min(E, first + n); e++) {
      const r = el("div", { class: "row" + (e === selected - 1 ? " sel" : "") + (oomAt.has(e) ? " oom" : "") }, list, eventLabel(e));
      r.style.top = (e * ROW) + "px";
      r.dataset.event = String(e);
    }
  }
  list.addEventListener("scroll", renderList);
  list.addEventListener("click", (e) => { const r = e.target.closest(".row"); if (r) select(+r.dataset.event + 1); });
  list.addEventListener("keydown", (e) => {
    const page = Math.floor(list.clientHeight / ROW);
    const step = { ArrowDown: 1, ArrowUp: -1, PageDown: page, PageUp: -page, Home: -Infinity, End: Infinity }[e.key];
    if (step === undefined) return;
    e.preventDefault();
    select(Math.max(1, Math.min(E, selected + step)), true);
  });

  // ---------------------------------------------------------------- segment map
  const seg = $("segments"), sctx = seg.getContext("2d");
  const SCOL = ["#d62728", "#ff7f0e", "#dddddd", "#f7f7f7"];
  const SNAME = ["allocated", "pending free", "free", "unmapped"];
  let segHits = [];
  function momentAt(state) {
    let best = null;
    for (const m of moments) if (m.state <= state && (!best || m.state > best.state)) best = m;
    return best || moments[0] || null;
  }
  function drawSegments() {
    const m = momentAt(selected);
    const note = $("seg-note");
    segHits = [];
    if (!m) { note.textContent = "no segment map: this picture was made without a replay"; seg.style.height = "30px"; resize(seg, 30); return; }
    note.textContent = NOHIST ? "the end state's segment map; " + m.segments.length + " segments"
      : (m.state === selected ? "segment map after " + eventText(selected - 1)
      : "segment map after " + eventText(m.state - 1) + ", the nearest captured moment at or before " +
        eventText(selected - 1) + " (" + moments.length + " moments captured)") +
      "; " + m.segments.length + " segments" + (HEAD.source ? "; " + HEAD.source : "");
    const rows = Math.min(m.segments.length, 1500), RH = 20;
    const h = Math.max(30, rows * RH + 8);
    seg.style.height = h + "px";
    const w = resize(seg, h);
    sctx.clearRect(0, 0, w, h);
    const LW = 210, BW = w - LW - 10;
    let biggest = 1;
    for (const s of m.segments) if (s[1] > biggest) biggest = s[1];
    sctx.font = "11px ui-monospace, monospace"; sctx.textBaseline = "middle";
    for (let r = 0; r < rows; r++) {
      const [a, total_, stream, expandable, blocks] = m.segments[r];
      const y = 4 + r * RH;
      sctx.fillStyle = "#333";
      sctx.fillText(hex(a) + " " + fmt(total_) + (expandable ? " exp" : ""), 2, y + RH / 2 - 1);
      const bw = BW * Math.max(0.12, Math.sqrt(total_ / biggest));
      let x = LW, off = 0;
      for (const [bsize, state, owner] of blocks) {
        const ww = Math.max(1, bw * bsize / total_);
        sctx.fillStyle = state === 0 && owner >= 0 && groupOf[owner] >= 0 ? "hsl(" + hue(groupOf[owner] + 1) + ",60%,50%)" : SCOL[state];
        sctx.fillRect(LW + bw * off / total_, y, ww, RH - 5);
        segHits.push([LW + bw * off / total_, y, ww, RH - 5, a, total_, stream, bsize, state, owner]);
        off += bsize; x += ww;
      }
      sctx.strokeStyle = "#999"; sctx.strokeRect(LW + 0.5, y + 0.5, bw, RH - 5);
    }
  }
  seg.addEventListener("mousemove", (e) => {
    const r = seg.getBoundingClientRect(), x = e.clientX - r.left, y = e.clientY - r.top;
    const hit = segHits.find((h) => x >= h[0] && x <= h[0] + h[2] + 0.5 && y >= h[1] && y <= h[1] + h[3]);
    if (!hit) { hideTip(); return; }
    const [, , , , a, tot, stream, bsize, state, owner] = hit;
    let text = "segment " + hex(a) + ", " + fmtLong(tot) + ", stream " + stream + "\nblock " + SNAME[state] + ": " + fmtLong(bsize);
    if (owner >= 0) text += "\n\n" + allocText(owner, false);
    showTip(e, text);
  });
  seg.addEventListener("mouseleave", hideTip);

  function select(state, scroll) {
    selected = Math.max(0, Math.min(E, state));
    $("state-label").textContent = NOHIST ? "the end" : selected ? eventText(selected - 1) : "start";
    drawCursor();
    drawSegments();
    if (liveAt.value === "selected") fillLive();
    if (scroll || selected - 1 < list.scrollTop / ROW || selected - 1 > (list.scrollTop + list.clientHeight) / ROW - 1) {
      list.scrollTop = Math.max(0, (selected - 1) * ROW - list.clientHeight / 2);
    }
    renderList();
    body.dataset.selected = String(selected);
  }

  draw();
  fillLive();
  select(peakState);
  window.addEventListener("resize", () => draw());
  body.dataset.firstDrawMs = String(Math.round(performance.now() - T0));
  body.dataset.ready = "1";
  window.accelrtView = { draw, setView, select, hitTimeline, hoverText, drawn: () => [...drawnSet],
    X: (s) => X(s), Y: (b) => Y(b), total, start, end, size,
    lowerAt: (i, s) => {  // where allocation i is drawn in the column sampling state s
      const rec = lows.get(i), k = sst.indexOf(s);
      return rec && k >= rec.k0 && k < rec.k0 + rec.lo.length ? rec.lo[k - rec.k0] : NaN;
    },
    bands: () => bandKey.map((key, j) => {  // each band's name and its tallest column
      let best = 0;
      for (let k = 1; k < nSamples; k++) if (bandVal[j * nSamples + k] > bandVal[j * nSamples + best]) best = k;
      let lo = 0;
      for (let q = 0; q < j; q++) lo += bandVal[q * nSamples + best];
      return { name: bandName(j), x: (sx0[best] + sx1[best]) / 2, lo: lo, bytes: bandVal[j * nSamples + best] };
    }) };
  if (location.hash.startsWith("#selftest")) selftest(location.hash);
}

// A check the browser tests run through --dump-dom: hover every drawn allocation (or up to
// 400) and every group band, zoom, and write what happened into <pre id="selftest">.
function selftest(hash) {
  const V = window.accelrtView, canvas = $("timeline");
  const r = canvas.getBoundingClientRect();
  const out = { drawn: V.drawn().length, hovers: [] };
  const drawn = V.drawn().sort((a, b) => a - b);
  const limit = /all/.test(hash) ? drawn.length : Math.min(drawn.length, 400);
  for (let n = 0; n < limit; n++) {
    const i = drawn[Math.floor(n * drawn.length / limit)];
    const s = Math.max(V.start[i], +body.dataset.view.split("-")[0]);
    // the middle of the allocation, in the column that samples state s (or a later one)
    let hit = null;
    for (let x = Math.max(0, Math.floor(V.X(s)) - 2); x < canvas.clientWidth; x++) {
      const cx = Math.round(r.left) + x + 1;  // mouse coordinates are whole pixels
      const col = V.hitTimeline({ clientX: cx, clientY: r.top + 20 });
      if (!col || col.oom || col.state < V.start[i]) continue;
      if (col.state >= V.end[i]) break;
      const lo = V.lowerAt(i, col.state);
      const cy = Math.round(r.top + (V.Y(lo) + V.Y(lo + V.size[i])) / 2);
      canvas.dispatchEvent(new MouseEvent("mousemove", { clientX: cx, clientY: cy, bubbles: true }));
      hit = { alloc: i, x: x, state: col.state, hovered: canvas.dataset.hover, tip: tip.textContent };
      break;
    }
    if (hit) out.hovers.push(hit);
  }
  // the groups too small to draw one by one: hover the middle of each band's tallest column
  out.bands = [];
  for (const band of V.bands()) {
    const cx = Math.round(r.left + band.x), cy = Math.round(r.top + (V.Y(band.lo) + V.Y(band.lo + band.bytes)) / 2);
    canvas.dispatchEvent(new MouseEvent("mousemove", { clientX: cx, clientY: cy, bubbles: true }));
    out.bands.push({ name: band.name, bytes: band.bytes, px: V.Y(band.lo) - V.Y(band.lo + band.bytes),
      hovered: canvas.dataset.hover, tip: tip.textContent });
  }
  const before = body.dataset.view + "/" + body.dataset.drawn;
  canvas.dispatchEvent(new WheelEvent("wheel", { deltaY: -100, clientX: r.left + canvas.clientWidth / 2, clientY: r.top + 100, bubbles: true, cancelable: true }));
  canvas.dispatchEvent(new WheelEvent("wheel", { deltaY: -100, clientX: r.left + canvas.clientWidth / 2, clientY: r.top + 100, bubbles: true, cancelable: true }));
  out.zoom = { before: before, after: body.dataset.view + "/" + body.dataset.drawn };
  $("selftest").textContent = JSON.stringify(out);
  body.dataset.selftest = "1";
}

main().catch(fail);
})();
