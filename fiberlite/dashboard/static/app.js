// fiberlite's run page: follows /api/events (or polls /api/state) and redraws; it only reads.
"use strict";
const POLL_MS = 500;
const openErrors = new Set();  // tracebacks the reader opened
const COLORS = ["#2f80ed", "#eb5757", "#27ae60", "#f2994a", "#9b51e0", "#56ccf2", "#bb6bd9", "#219653"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node[k] = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}
const fmt = {
  num: (x, d = 1) => (x === null || x === undefined) ? "–" : Number(x).toFixed(d),
  bytes: (b) => b === null || b === undefined ? "–" : b >= 1 << 30 ? (b / (1 << 30)).toFixed(1) + " GiB" : b >= 1 << 20 ? (b / (1 << 20)).toFixed(1) + " MiB" : (b / 1024).toFixed(1) + " KiB",
  rate: (b) => b === null || b === undefined ? "–" : b >= 1 << 20 ? (b / (1 << 20)).toFixed(1) + " MiB/s" : (b / 1024).toFixed(1) + " KiB/s",
  secs: (s) => s === null || s === undefined ? "–" : s < 90 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min",
};

function fillRows(tableId, rows, cells) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows.map((r) => el("tr", {}, ...cells(r).map((c) => c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c)))));
  if (!rows.length) body.append(el("tr", {}, el("td", { class: "muted", colspan: 9 }, "none")));
}

function progress(done, total, failed) {
  const share = total ? Math.min(1, done / total) : 0;
  return el("span", { class: "bar" + (failed ? " failed" : "") }, el("div", { style: `width:${(100 * share).toFixed(1)}%` }));
}

function drawPool(pool) {
  const batches = el("table", {}, el("thead", {}, el("tr", {}, ...["call", "function", "progress", "done", "failed", "rate /s", "time left"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...pool.batches.map((b) => el("tr", { "data-batch": b.id },
      el("td", {}, `${b.call} #${b.id}`), el("td", {}, b.function), el("td", {}, progress(b.done, b.total, b.failed)),
      el("td", { class: "done" }, `${b.done} / ${b.total ?? "?"}`), el("td", { class: b.failed ? "bad" : "" }, b.failed),
      el("td", {}, fmt.num(b.rate, 0)), el("td", {}, b.finished ? "done" : fmt.secs(b.left))))));
  const errors = pool.errors.map((e, i) => {
    const key = `${pool.name}/${e.batch}/${pool.errors.length - i}`;  // stays with the error across redraws
    const box = el("details", openErrors.has(key) ? { open: "" } : {},
      el("summary", { class: "bad" }, `${e.function} (call #${e.batch}): ${e.error}`), el("pre", {}, e.traceback));
    box.ontoggle = () => (box.open ? openErrors.add(key) : openErrors.delete(key));
    return box;
  });
  return el("div", { class: "pool" },
    el("h3", {}, `${pool.name} `, el("span", { class: "muted" },
      `${pool.state} · ${pool.workers} of ${pool.size} workers (${pool.ready} ready) in ${pool.jobs.length} jobs on ${pool.hosts.join(", ") || "–"} · ` +
      `${pool.done} tasks done · ${pool.losses} workers lost · ${pool.retries} chunks retried`)),
    batches, ...errors);
}

function drawRing(ring) {
  const head = ["rank", "job", "host", "state", "collectives", "collectives /s", "data /s", "data"];
  return el("div", { class: "ring" }, el("h3", {}, `${ring.name} `, el("span", { class: "muted" }, `world size ${ring.world_size}, ${ring.joined} joined`)),
    el("table", {}, el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
      el("tbody", {}, ...ring.members.map((m) => el("tr", { "data-rank": m.rank }, el("td", {}, `rank ${m.rank}`), el("td", {}, m.job), el("td", {}, m.host ?? "–"),
        el("td", {}, m.exitcode ?? (m.joined ? "running" : "starting")), el("td", { class: "collectives" }, m.collectives ?? "–"),
        el("td", { class: "collective-rate" }, fmt.num(m.collectives_per_s)), el("td", {}, fmt.rate(m.bytes_per_s)), el("td", { class: "bytes" }, fmt.bytes(m.bytes)))))));
}

function drawChart(id, series) {
  const svg = document.getElementById(id);
  const all = series.flatMap((s) => s.points);
  if (!all.length) { svg.innerHTML = ""; return; }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
  const top = Math.max(1, ...all.map((p) => p[1])) * 1.1;
  const x = (t) => (600 * (t - t0)) / (t1 - t0), y = (v) => 115 - (110 * v) / top;
  svg.innerHTML = `<text x="4" y="12" font-size="10" fill="#5b6472">${top.toFixed(0)}</text>` + series.map((s) =>
    `<polyline fill="none" stroke="${s.color}" stroke-width="2" vector-effect="non-scaling-stroke" points="${s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")}"/>`).join("");
}

async function showLog(job) {
  const box = document.getElementById("log");
  box.hidden = false;
  document.getElementById("log-job").textContent = job;
  const answer = await fetch(`api/logs?job=${encodeURIComponent(job)}`).then((r) => r.json());
  document.getElementById("log-text").textContent = answer.text ?? answer.error;
}

// the charts' history: sent whole, or as the points added since the last update
let charts = { tasks_per_second: [], cpu: {} };
function addPoints(points, history) {
  const keep = (series, more) => series.concat(more).slice(-history);
  charts.tasks_per_second = keep(charts.tasks_per_second, points.tasks_per_second);
  // a job's series goes on while it runs: one not in the points has ended
  charts.cpu = Object.fromEntries(Object.entries(points.cpu).map(([name, more]) => [name, keep(charts.cpu[name] || [], more)]));
}

function draw(s) {
  if (s.charts) charts = s.charts; else if (s.points) addPoints(s.points, s.history);
  document.getElementById("run").textContent = `${s.run} (${s.backend})`;
  drawChart("chart-tasks", [{ color: COLORS[0], points: charts.tasks_per_second }]);
  const cpu = Object.entries(charts.cpu).map(([name, points], i) => ({ name, points, color: COLORS[i % COLORS.length] }));
  drawChart("chart-cpu", cpu);
  document.getElementById("cpu-legend").replaceChildren(...cpu.map((c) => el("span", { style: `color:${c.color}` }, "■ " + c.name)));
  document.getElementById("pool-list").replaceChildren(...(s.pools.length ? s.pools.map(drawPool) : [el("p", { class: "muted" }, "none")]));
  fillRows("jobs", s.jobs, (j) => [j.name, j.process, j.backend, j.host, el("td", { class: "state-" + j.state }, j.state), j.exitcode ?? "",
    fmt.num(j.cpu), j.memory !== null ? fmt.bytes(j.memory) : (j.requested || "–"), el("button", { onclick: () => showLog(j.name) }, "tail")]);
  fillRows("queues", s.queues, (q) => [q.name, q.size, q.maxsize || "∞", q.readers, q.writers, q.total]);
  fillRows("managers", s.managers, (m) => [m.name, m.job ?? "–", m.state]);
  document.getElementById("ring-list").replaceChildren(...(s.rings.length ? s.rings.map(drawRing) : [el("p", { class: "muted" }, "none")]));
  document.getElementById("status").textContent = `updated ${new Date(s.time * 1000).toLocaleTimeString()} · ${s.tasks_done} tasks done`;
  document.body.dataset.draws = Number(document.body.dataset.draws || 0) + 1;  // updates so far
}

// the last whole data drawn; a message of counts alone (progress) is merged into it
let latest = null;
function merged(message) {
  if (!message.progress) return (latest = message);
  if (latest === null) return null;
  const { charts: _c, points: _p, ...base } = latest;  // its charts were drawn already
  const pools = base.pools.map((pool) => {
    const now = message.progress.pools[pool.name];
    if (!now) return pool;
    const rows = new Map(now.batches.map((b) => [b.id, b]));
    const fresh = now.batches.filter((b) => !pool.batches.some((old) => old.id === b.id));
    return { ...pool, done: now.done, batches: [...fresh, ...pool.batches.map((b) => rows.get(b.id) ?? b)] };
  });
  return (latest = { ...base, pools, tasks_done: message.progress.tasks_done, time: message.time });
}

async function poll() {
  try {
    draw(await fetch("api/state", { cache: "no-store" }).then((r) => r.json()));
  } catch (error) {
    document.getElementById("status").textContent = "run ended or unreachable";
  }
  setTimeout(poll, POLL_MS);
}

// The master pushes the page's data each time it changes; where the stream cannot come
// through (a relay that waits for whole answers), the page asks for it every POLL_MS.
function follow() {
  const events = new EventSource("api/events");
  let streamed = false;
  events.onmessage = (message) => {
    streamed = true;
    const data = merged(JSON.parse(message.data));
    if (data !== null) draw(data);
  };
  events.onerror = () => {
    if (!streamed) { events.close(); poll(); return; }
    document.getElementById("status").textContent = "run ended or unreachable";
  };
}
follow();
