// The live page: polls /stats about twice a second and draws the charts on <canvas> by hand
// (no libraries, no CDN). window.aiovecPage exposes what is drawn, for tests and curious users.
"use strict";

const POLL_MS = 500;
const $ = (id) => document.getElementById(id);
const page = { polls: 0, errors: 0, selected: null, points: {}, lastSteps: 0 };
window.aiovecPage = page;

// -- a tiny line/scatter chart ---------------------------------------------------------
function niceNum(x) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  const a = Math.abs(x);
  if (a >= 1e6) return (x / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (x / 1e3).toFixed(1) + "k";
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  return x.toFixed(2);
}

// series: [{points: [[x, y], ...], color, dots: bool, step: bool}]
function drawChart(canvas, series, opts = {}) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(50, canvas.clientWidth), h = Math.max(50, canvas.clientHeight);
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, w, h);
  const L = 52, R = 10, T = 10, B = 26;
  const pw = w - L - R, ph = h - T - B;
  let xmin = Infinity, xmax = -Infinity, ymin = opts.yZero ? 0 : Infinity, ymax = -Infinity, n = 0;
  for (const s of series) {
    for (const [x, y] of s.points) {
      if (y === null || !isFinite(y)) continue;
      xmin = Math.min(xmin, x); xmax = Math.max(xmax, x);
      ymin = Math.min(ymin, y); ymax = Math.max(ymax, y);
      n++;
    }
  }
  canvas.dataset.points = String(n);
  // frame and axes
  ctx.strokeStyle = "#999";
  ctx.lineWidth = 1;
  ctx.strokeRect(L + 0.5, T + 0.5, pw, ph);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#555";
  if (n === 0) {
    ctx.textAlign = "center";
    ctx.fillText("waiting for data…", L + pw / 2, T + ph / 2);
    return 0;
  }
  if (xmax === xmin) { xmax = xmin + 1; }
  if (opts.yInteger) { ymin = Math.floor(ymin); ymax = Math.max(ymin + 1, Math.ceil(ymax * 1.1)); }
  if (ymax === ymin) { ymax = ymin + (Math.abs(ymin) || 1) * 0.1; ymin = opts.yZero ? ymin : ymin - (Math.abs(ymin) || 1) * 0.1; }
  if (!opts.yInteger) ymax += (ymax - ymin) * 0.05;
  const X = (x) => L + ((x - xmin) / (xmax - xmin)) * pw;
  const Y = (y) => T + ph - ((y - ymin) / (ymax - ymin)) * ph;
  // grid and tick labels
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const yStep = opts.yInteger ? Math.max(1, Math.ceil((ymax - ymin) / 4)) : (ymax - ymin) / 4;
  for (let v = ymin; v <= ymax + 1e-9; v += yStep) {
    const y = Y(v);
    ctx.strokeStyle = "#eee";
    ctx.beginPath(); ctx.moveTo(L + 1, y); ctx.lineTo(L + pw - 1, y); ctx.stroke();
    ctx.fillText(opts.yInteger ? String(Math.round(v)) : niceNum(v), L - 4, y);
  }
  ctx.textBaseline = "top";
  for (let i = 0; i <= 4; i++) {
    const v = xmin + ((xmax - xmin) * i) / 4;
    ctx.textAlign = i === 0 ? "left" : i === 4 ? "right" : "center";
    ctx.fillText(niceNum(v) + (opts.xUnit || ""), X(v), T + ph + 6);
  }
  // data
  ctx.save();
  ctx.beginPath(); ctx.rect(L, T, pw, ph); ctx.clip();
  for (const s of series) {
    ctx.strokeStyle = ctx.fillStyle = s.color;
    ctx.lineWidth = s.width || 2;
    if (s.dots) {
      for (const [x, y] of s.points) {
        if (y === null || !isFinite(y)) continue;
        ctx.fillRect(X(x) - 1.5, Y(y) - 1.5, 3, 3);
      }
      continue;
    }
    ctx.beginPath();
    let started = false, py = 0;
    for (const [x, y] of s.points) {
      if (y === null || !isFinite(y)) { started = false; continue; }
      if (!started) { ctx.moveTo(X(x), Y(y)); started = true; }
      else if (s.step) { ctx.lineTo(X(x), Y(py)); ctx.lineTo(X(x), Y(y)); }
      else ctx.lineTo(X(x), Y(y));
      py = y;
    }
    ctx.stroke();
  }
  ctx.restore();
  return n;
}

function movingMean(points, k) {
  const out = [];
  let sum = 0;
  for (let i = 0; i < points.length; i++) {
    sum += points[i][1];
    if (i >= k) sum -= points[i - k][1];
    out.push([points[i][0], sum / Math.min(i + 1, k)]);
  }
  return out;
}

// -- the page --------------------------------------------------------------------------
function showError(msg) { $("error").textContent = msg || ""; }

function updateSelector(rollouts) {
  const sel = $("rollout");
  const ids = rollouts.map((r) => String(r.id));
  if (page.selected === null || !ids.includes(page.selected)) {
    const running = rollouts.filter((r) => r.state === "running" || r.state === "starting");
    const pick = running.length ? running[running.length - 1] : rollouts[rollouts.length - 1];
    page.selected = pick ? String(pick.id) : null;
  }
  const want = rollouts.map((r) => `${r.id}|${r.env_id}|${r.state}`).join(",");
  if (sel.dataset.key !== want) {
    sel.dataset.key = want;
    sel.innerHTML = "";
    for (const r of rollouts) {
      const o = document.createElement("option");
      o.value = String(r.id);
      o.textContent = `#${r.id} ${r.env_id} ×${r.num_envs} (${r.state})`;
      sel.appendChild(o);
    }
  }
  if (page.selected !== null) sel.value = page.selected;
}

function render(data) {
  const lag = data.server && data.server.loop_lag;
  $("loop-lag").textContent = lag && lag.samples ? (lag.p99_s * 1000).toFixed(1) + " ms" : "–";
  const rollouts = data.rollouts || [];
  updateSelector(rollouts);
  const r = rollouts.find((x) => String(x.id) === page.selected);
  if (!r) {
    $("state").textContent = "no rollout yet: start one above";
    for (const id of ["chart-workers", "chart-rate", "chart-latency", "chart-returns"]) drawChart($(id), []);
    return;
  }
  $("state").textContent = `${r.state}${r.error ? ": " + r.error : ""}${r.last_decision ? " · controller: " + r.last_decision : ""}`;
  $("workers").textContent = String(r.num_workers);
  $("steps").textContent = String(r.steps);
  $("rate").textContent = niceNum(r.steps_per_s);
  const lat = r.latency_s || {};
  $("latency").textContent = lat.p50 != null ? `${(lat.p50 * 1000).toFixed(2)} / ${(lat.p99 * 1000).toFixed(2)} ms` : "–";
  $("episodes").textContent = String(r.episodes_finished);
  $("mean-return").textContent = niceNum(r.mean_recent_return);
  page.lastSteps = r.steps;

  const h = r.history || [];
  const ret = r.recent_returns.map((e) => [e.index, e.return]);
  page.points = {
    workers: drawChart($("chart-workers"), [{ points: h.map((p) => [p.t, p.num_workers]), color: "#2ca02c", step: true }], { yZero: true, yInteger: true, xUnit: "s" }),
    rate: drawChart($("chart-rate"), [{ points: h.map((p) => [p.t, p.steps_per_s]), color: "#1f77b4" }], { yZero: true, xUnit: "s" }),
    latency: drawChart($("chart-latency"), [
      { points: h.map((p) => [p.t, p.latency_p50_s === null ? null : p.latency_p50_s * 1000]), color: "#1f77b4" },
      { points: h.map((p) => [p.t, p.latency_p99_s === null ? null : p.latency_p99_s * 1000]), color: "#d62728" },
    ], { yZero: true, xUnit: "s" }),
    returns: drawChart($("chart-returns"), [
      { points: ret, color: "#9467bd", dots: true },
      { points: movingMean(ret, 20), color: "#ff7f0e", width: 2 },
    ], { yZero: true }),
  };
}

async function poll() {
  try {
    const resp = await fetch("/stats?history=240", { cache: "no-store" });
    if (!resp.ok) throw new Error(`/stats: HTTP ${resp.status}`);
    render(await resp.json());
    page.polls++;
  } catch (err) {
    page.errors++;
    showError(String(err));
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

async function postJSON(url, body) {
  const resp = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}) });
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) throw new Error(data.error || `HTTP ${resp.status}`);
  return data;
}

$("start-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  showError("");
  try {
    const r = await postJSON("/rollouts", { env_id: f.get("env_id"), num_envs: Number(f.get("num_envs")), num_workers: f.get("num_workers"), mode: f.get("mode") });
    page.selected = String(r.id);
  } catch (err) { showError("start: " + err.message); }
});

$("stop").addEventListener("click", async () => {
  if (page.selected === null) return;
  showError("");
  try { await postJSON(`/rollouts/${page.selected}/stop`); } catch (err) { showError("stop: " + err.message); }
});

$("rollout").addEventListener("change", (ev) => { page.selected = ev.target.value; });

poll();
