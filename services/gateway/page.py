"""The live page at ``/``: the numbers that matter and a learning curve, plain HTML and one inline script.

No external resources (no CDN, no fonts): it must work on a machine without internet. The script polls
``/status`` and ``/history`` every second and draws the curve on a <canvas>. For an env that declares its own
measures (flywheel.envs.measures: a progress value and a success flag) cards and a second chart show them under
the env's labels (from the actors' telemetry info), level-start and restarted episodes apart; they stay hidden
while no actor reports them.
"""

LIVE_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Flywheel</title>
<style>
  :root { --bg: #10141a; --card: #1a2029; --fg: #e6e9ee; --dim: #8b95a5; --ok: #3fb950; --bad: #f85149;
          --a: #58a6ff; --b: #f0883e; --c: #a371f7; }
  body { margin: 0; background: var(--bg); color: var(--fg); font: 14px/1.4 system-ui, sans-serif; }
  header { display: flex; gap: 16px; align-items: baseline; padding: 12px 20px; border-bottom: 1px solid #2a3240; }
  header h1 { font-size: 18px; margin: 0; }
  header span { color: var(--dim); }
  main { padding: 16px 20px; display: grid; gap: 16px; }
  .cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px; }
  .card { background: var(--card); border-radius: 6px; padding: 10px 12px; }
  .card .label { color: var(--dim); font-size: 12px; }
  .card .value { font-size: 22px; font-variant-numeric: tabular-nums; }
  .panel { background: var(--card); border-radius: 6px; padding: 12px; }
  .panel h2 { font-size: 14px; margin: 0 0 8px; color: var(--dim); font-weight: normal; }
  table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
  th, td { text-align: right; padding: 3px 8px; border-bottom: 1px solid #2a3240; }
  th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
  th { color: var(--dim); font-weight: normal; }
  .up { color: var(--ok); } .down { color: var(--bad); }
  canvas { width: 100%; height: 280px; display: block; }
  video { max-width: 100%; max-height: 480px; display: block; image-rendering: pixelated; background: #000; }
  .legend span { margin-right: 14px; } .legend b { font-weight: normal; }
  .legend i { display: inline-block; width: 10px; height: 3px;
    vertical-align: middle; margin-right: 4px; }
  #error { color: var(--bad); }
</style>
</head>
<body>
<header>
  <h1>Flywheel</h1>
  <span id="gateway">connecting...</span>
  <span id="updated"></span>
  <span id="error"></span>
</header>
<main>
  <section class="cards">
    <div class="card"><div class="label">env steps/s</div><div class="value" id="env_steps_per_s">-</div></div>
    <div class="card"><div class="label">transitions/s into replay</div>
      <div class="value" id="transitions_received_per_s">-</div></div>
    <div class="card"><div class="label">replay size</div><div class="value" id="replay_size">-</div></div>
    <div class="card"><div class="label">samples/s</div><div class="value" id="samples_per_s">-</div></div>
    <div class="card"><div class="label">learner updates/s</div><div class="value" id="updates_per_s">-</div></div>
    <div class="card"><div class="label">weight version</div><div class="value" id="weight_version">-</div></div>
    <div class="card"><div class="label">policy lag (max, versions)</div>
      <div class="value" id="policy_lag">-</div></div>
    <div class="card"><div class="label">learner waiting for data</div>
      <div class="value" id="data_wait_ratio">-</div></div>
    <div class="card"><div class="label">loss</div><div class="value" id="loss">-</div></div>
    <div class="card"><div class="label">episode return (mean)</div>
      <div class="value" id="episode_return_mean">-</div></div>
    <div class="card"><div class="label">greedy eval return</div>
      <div class="value" id="eval_return_mean">-</div></div>
    <div class="card"><div class="label" id="eval_label">learner evaluation</div>
      <div class="value" id="eval_summary">-</div></div>
    <div class="card measure" hidden><div class="label" id="progress_title">progress mean</div>
      <div class="value" id="progress_mean">-</div></div>
    <div class="card measure" hidden><div class="label" id="progress_max_title">progress max</div>
      <div class="value" id="progress_max">-</div></div>
    <div class="card measure" hidden><div class="label" id="success_title">success rate</div>
      <div class="value" id="success_rate">-</div></div>
  </section>
  <section class="panel">
    <h2>Learning curve: episode return over time</h2>
    <div class="legend"><span><i style="background: var(--a)"></i>return (mean over actors)</span>
      <span><i style="background: var(--b)"></i>greedy eval return</span>
      <span id="curve_info"></span></div>
    <canvas id="curve" data-points="0"></canvas>
  </section>
  <section class="panel" id="measures_panel" hidden>
    <h2 id="measures_title">progress and success rate over time</h2>
    <div class="legend"><span><i style="background: #56d4dd"></i><b id="legend_progress_mean"></b></span>
      <span><i style="background: #a371f7"></i><b id="legend_progress_max"></b></span>
      <span id="legend_restarted_item" hidden><i style="background: #f778ba"></i><b id="legend_restarted"></b></span>
      <span><i style="background: #e3b341"></i><b id="legend_success"></b></span>
      <span id="measures_info"></span></div>
    <canvas id="measures" data-points="0"></canvas>
  </section>
  <section class="panel" id="clip_panel" hidden>
    <h2>Watch it play: the newest greedy episode</h2>
    <div class="legend"><span id="clip_info"></span></div>
    <video id="clip" controls muted autoplay loop playsinline></video>
  </section>
  <section class="panel">
    <h2>Services</h2>
    <table id="services"><thead><tr><th>service</th><th>instance</th><th>state</th><th>version</th>
      <th>key rate</th><th>epsilon</th><th>weights</th><th>last report</th></tr></thead><tbody></tbody></table>
  </section>
</main>
<script>
"use strict";
const KEY_RATE = {actor: ["env_steps_total", "env steps/s"], replay: ["transitions_received_total", "inserts/s"],
                  learner: ["updates_total", "updates/s"]};
let curve = [], thinned = -1, lastT = null;

function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(digits === undefined ? 2 : digits);
}
function setText(id, text) { document.getElementById(id).textContent = text; }
function has(v) { return v !== null && v !== undefined; }

function renderStatus(s) {
  const g = s.gateway, m = s.summary;
  setText("gateway", "gateway " + g.instance + " v" + g.version + ", up " + fmt(g.uptime_s, 0) + " s, control " +
          (g.control_enabled ? "on" : "off"));
  setText("updated", "updated " + new Date(g.time * 1000).toLocaleTimeString());
  for (const k of ["env_steps_per_s", "transitions_received_per_s", "samples_per_s", "updates_per_s",
                   "weight_version", "loss", "episode_return_mean", "eval_return_mean"]) {
    setText(k, fmt(m[k], k === "loss" ? 4 : 1));
  }
  setText("replay_size", m.replay_size === null ? "-" :
          fmt(m.replay_size) + (m.replay_capacity ? " / " + fmt(m.replay_capacity) : ""));
  setText("policy_lag", m.policy_lag_versions ? fmt(m.policy_lag_versions.max, 0) : "-");
  setText("data_wait_ratio", m.data_wait_ratio === null ? "-" : (100 * m.data_wait_ratio).toFixed(0) + " %");
  // the learner's last evaluation under its preset's protocol (success rate and progress where the env has them)
  setText("eval_label", "learner evaluation" + (has(m.eval_version) ? " (v" + fmt(m.eval_version, 0) + ")" : ""));
  setText("eval_summary", has(m.eval_success_rate) ?
          (100 * m.eval_success_rate).toFixed(0) + " % " + (m.eval_success_label || "success") + ", " +
          (m.eval_progress_label || "progress") + " " + fmt(m.eval_progress_mean, 0) :
          has(m.eval_return) ? "return " + fmt(m.eval_return, 1) : "-");
  renderMeasures(m);
  const body = document.querySelector("#services tbody");
  const rows = [];
  for (const [service, info] of Object.entries(s.services)) {
    for (const inst of info.instances) {
      const key = KEY_RATE[service];
      const restarted = inst.gauges.start_state_share_actual;  // the start-state curriculum, where an actor runs it
      const rate = (key ? fmt(inst.rates[key[0]], 1) + " " + key[1] : "") +
                   (has(restarted) ? ", " + (100 * restarted).toFixed(0) + " % restarted" : "");
      const tr = document.createElement("tr");
      tr.className = "instance";
      const cells = [service, inst.instance, inst.up ? "up" : "down", inst.version || "-", rate,
                     fmt(inst.gauges.epsilon, 4), fmt(inst.gauges.weight_version, 0), fmt(inst.age_s, 1) + " s ago"];
      cells.forEach((text, i) => {
        const td = document.createElement("td");
        td.textContent = text;
        if (i === 2) td.className = inst.up ? "up" : "down";
        tr.appendChild(td);
      });
      rows.push(tr);
    }
  }
  body.replaceChildren(...rows);
}

// The env's own measures under its labels (the actors' telemetry info): shown once an actor reports progress or
// success; episodes restarted at a kept start state (the start-state curriculum) apart from level-start ones.
let labels = {progress: "progress", success: "success"};
function pct(v) { return has(v) ? (100 * v).toFixed(1) + " %" : "-"; }
function renderMeasures(m) {
  labels = {progress: m.progress_label || "progress", success: m.success_label || "success"};
  const shown = has(m.progress_mean) || has(m.success_rate);
  for (const card of document.querySelectorAll(".card.measure")) card.hidden = !shown;
  const restarted = has(m.restarted_progress_mean) || has(m.restarted_success_rate);
  const apart = restarted ? " (level start / restarted)" : "";
  setText("progress_title", labels.progress + " mean" + apart);
  setText("progress_mean", fmt(m.progress_mean, 0) + (restarted ? " / " + fmt(m.restarted_progress_mean, 0) : ""));
  setText("progress_max_title", labels.progress + " max");
  setText("progress_max", fmt(m.progress_max, 0));
  setText("success_title", labels.success + " rate" + apart);
  setText("success_rate", pct(m.success_rate) + (restarted ? " / " + pct(m.restarted_success_rate) : ""));
  setText("measures_title", labels.progress + " and " + labels.success + " rate over time");
  setText("legend_progress_mean", labels.progress + " (mean over actors, left axis)");
  setText("legend_progress_max", labels.progress + " (max)");
  setText("legend_restarted", labels.progress + " of restarted episodes (mean)");
  setText("legend_success", labels.success + " rate (right axis)");
}

// One chart over the history points: ``series`` on the left axis, ``right`` (a 0..1 share) on a right axis in %.
function drawChart(id, series, right, waiting) {
  const canvas = document.getElementById(id);
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const ctx = canvas.getContext("2d");
  ctx.scale(dpr, dpr);
  ctx.clearRect(0, 0, w, h);
  const lines = right ? series.concat([right]) : series;
  const pts = curve.filter(p => lines.some(([k]) => has(p[k])));
  canvas.dataset.points = String(pts.length);
  if (pts.length === 0) {
    ctx.fillStyle = "#8b95a5"; ctx.font = "13px system-ui";
    ctx.fillText(waiting, 50, h / 2);
    return 0;
  }
  const t0 = pts[0].t, t1 = Math.max(pts[pts.length - 1].t, t0 + 1);
  let lo = Infinity, hi = -Infinity;
  for (const p of pts) for (const [k] of series) if (has(p[k])) { lo = Math.min(lo, p[k]); hi = Math.max(hi, p[k]); }
  if (lo === Infinity) { lo = 0; hi = 1; }
  if (hi - lo < 1e-9) { hi += 1; lo -= 1; }
  const L = 56, R = right ? 48 : 12, T = 10, B = 28;
  const x = t => L + (t - t0) / (t1 - t0) * (w - L - R);
  const y = v => T + (hi - v) / (hi - lo) * (h - T - B);
  const yRight = v => T + (1 - v) * (h - T - B);
  ctx.strokeStyle = "#2a3240"; ctx.fillStyle = "#8b95a5"; ctx.font = "11px system-ui"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = lo + (hi - lo) * i / 4, yy = y(v);
    ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(w - R, yy); ctx.stroke();
    ctx.fillText(fmt(v, 1), 4, yy + 4);
    if (right) {
      ctx.textAlign = "right"; ctx.fillText((25 * i) + " %", w - 4, yRight(i / 4) + 4); ctx.textAlign = "start";
    }
  }
  const span = t1 - t0;
  const [unit, div] = span < 180 ? ["s", 1] : span < 3 * 3600 ? ["min", 60] : ["h", 3600];
  ctx.textAlign = "center";
  for (let i = 0; i <= 4; i++) {
    const t = t0 + span * i / 4;
    ctx.fillText(((t - t0) / div).toFixed(span / div < 10 ? 1 : 0) + " " + unit,
                 Math.min(Math.max(x(t), L + 12), w - R - 16), h - 8);
  }
  ctx.textAlign = "start";
  const draw = (k, color, scale) => {
    ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.beginPath();
    let started = false;
    for (const p of pts) {
      if (!has(p[k])) continue;
      if (started) ctx.lineTo(x(p.t), scale(p[k])); else { ctx.moveTo(x(p.t), scale(p[k])); started = true; }
    }
    ctx.stroke();
  };
  for (const [k, color] of series) draw(k, color, y);
  if (right) draw(right[0], right[1], yRight);
  return pts.length;
}

function drawCurve() {
  const n = drawChart("curve", [["return_mean", "#58a6ff"], ["eval_return_mean", "#f0883e"]], null,
                      "waiting for the first finished episodes...");
  setText("curve_info", n + " points");
  const panel = document.getElementById("measures_panel");  // envs with measures: once an actor reports them
  panel.hidden = !curve.some(p => has(p.progress_mean) || has(p.progress_max) || has(p.success_rate));
  if (!panel.hidden) {
    document.getElementById("legend_restarted_item").hidden = !curve.some(p => has(p.restarted_progress_mean));
    const charted = drawChart("measures", [["progress_mean", "#56d4dd"], ["progress_max", "#a371f7"],
                                           ["restarted_progress_mean", "#f778ba"]], ["success_rate", "#e3b341"],
                              "waiting for the first finished episodes...");
    setText("measures_info", charted + " points");
  }
}

let clipShown = null;
function renderClip(c) {
  if (!c) return;
  const key = c.instance + "/" + c.sent_time;
  if (key === clipShown) return;
  clipShown = key;
  document.getElementById("clip_panel").hidden = false;
  const video = document.getElementById("clip");
  video.onloadedmetadata = () => { video.dataset.size = video.videoWidth + "x" + video.videoHeight; };
  video.src = "clip.mp4?t=" + encodeURIComponent(c.sent_time);
  setText("clip_info", c.env_id + ", weights v" + c.weight_version + ", return " + fmt(c.episode_return, 1) +
          " in " + c.length + " steps" + (has(c.progress) ? ", " + labels.progress + " " + fmt(c.progress, 0) : "") +
          (c.success ? ", " + labels.success + " reached" : "") +
          ", filmed by " + c.instance + " at " + new Date(c.sent_time * 1000).toLocaleTimeString());
}

async function poll() {
  try {
    const status = await (await fetch("status", {cache: "no-store"})).json();
    renderStatus(status);
    renderClip(status.clip);
    const url = lastT === null ? "history" : "history?since=" + lastT;
    const hist = await (await fetch(url, {cache: "no-store"})).json();
    if (hist.thinned !== thinned && lastT !== null) {  // the gateway thinned its curve: start over
      thinned = hist.thinned; lastT = null; curve = [];
      return;
    }
    thinned = hist.thinned;
    curve = curve.concat(hist.points);
    if (curve.length) lastT = curve[curve.length - 1].t;
    drawCurve();
    setText("error", "");
  } catch (e) {
    setText("error", "gateway unreachable: " + e);
  }
}
poll();
setInterval(poll, 1000);
window.addEventListener("resize", drawCurve);
</script>
</body>
</html>
"""
