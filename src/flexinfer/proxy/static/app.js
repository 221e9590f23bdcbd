// FlexInfer status page: polls /ui/api/status (and the chosen model's log) and redraws.
// Plain JavaScript, no build step, no external resources.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const STAGE_COLORS = { queue: "#9aa3b5", drain: "#e39b5b", staging: "#5b8fe3", server_start: "#8b6fd6", health: "#4fb07a", restore: "#c9a227" };
const KIND_COLORS = { cold_start: "#5b8fe3", swap: "#e39b5b" };
const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem("flexinfer-token") || ""; }

async function getJSON(path) {
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401) { $("login").hidden = false; throw new Error("a bearer token is needed"); }
  const body = await response.json();
  if (!response.ok) { throw new Error((body.error && body.error.message) || response.statusText); }
  return body;
}

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) { node.setAttribute(k, v); }
  if (text !== undefined) { node.textContent = text; }
  return node;
}

function seconds(s) { return s === null || s === undefined ? "–" : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s"; }
function ago(s) { return s === null || s === undefined ? "never" : seconds(s) + " ago"; }
function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

function renderModels(models) {
  const body = $("models").tBodies[0];
  body.replaceChildren(...models.map((m) => {
    const row = el("tr", { "data-key": m.key, "data-phase": m.phase });
    row.append(el("td", {}, m.key), el("td", {}, m.group || "–"));
    const phase = el("td"); phase.append(el("span", { class: "phase phase-" + m.phase }, m.phase + (m.draining ? " (draining)" : "")));
    row.append(phase, el("td", {}, String(m.queue_depth)), el("td", {}, String(m.in_flight)), el("td", {}, ago(m.last_swap_age)),
      el("td", {}, m.need ? `${mib(m.need.mib)} (${m.need.source})` : "–"));
    return row;
  }));
}

function renderGroups(groups) {
  const names = Object.keys(groups).sort();
  $("groups").replaceChildren(...(names.length ? names.map((g) =>
    el("li", { "data-group": g, "data-holder": groups[g] || "" }, g + ": " + (groups[g] || "free"))) : [el("li", { class: "muted" }, "no shared GPU groups")]));
}

function mib(x) { return x >= 1024 ? (x / 1024).toFixed(1) + " GiB" : x.toFixed(x < 10 ? 1 : 0) + " MiB"; }

// A bar per group that packs by memory: what its Ready members hold, what is reserved for the ones loading,
// and the free rest of its budget.
function renderMemory(groups) {
  $("memory").replaceChildren(...(groups || []).map((g) => {
    const used = Math.min(100, 100 * g.used_mib / g.budget_mib), reserved = Math.min(100 - used, 100 * g.reserved_mib / g.budget_mib);
    // The in-cluster proxy does not know the evictions (the manager's /metrics counts them): no "evicted" then.
    const evicted = g.evictions ? `, ${Object.values(g.evictions).reduce((a, b) => a + b, 0)} evicted` : "";
    const item = el("li", { class: "memory", "data-group": g.group, "data-used": g.used_mib, "data-reserved": g.reserved_mib, "data-budget": g.budget_mib });
    item.append(el("div", { class: "memory-label" }, `${g.group}: ${mib(g.used_mib)} used, ${mib(g.reserved_mib)} loading, of ${mib(g.budget_mib)} (${g.models.length} running${evicted})`));
    const bar = el("div", { class: "membar", title: g.models.join(", ") || "nothing running" });
    bar.append(el("span", { class: "used", style: `width: ${used}%` }), el("span", { class: "reserved", style: `width: ${reserved}%` }));
    item.append(bar);
    return item;
  }));
  $("memory").hidden = !(groups || []).length;
}

// One row per activation. A row's 0 is its origin: the first request that waited for the group when the
// model queued (the server sends every stage offset from there, never negative), else the decision. The
// decision is marked; the figure after the bar is decision → Ready, plus how long requests queued before it.
const TIMELINE = { rowH: 24, labelW: 300, width: 900, right: 170 };

function rowEnd(a) { return Math.max((a.decision || 0) + a.seconds, ...a.stages.map((s) => s.end)); }

// Shorten an SVG text node until it fits `width`, cutting from the middle so the row's time and kind (at the
// start) and the model it started and the result (at the end) stay; the full text stays in its tooltip.
function fitText(node, text, width) {
  const shown = document.createTextNode(text);
  node.replaceChildren(shown);
  if (node.getComputedTextLength() <= width) { return; }
  node.append(el("svg:title", {}, text));
  for (let keep = text.length - 1; keep > 1 && node.getComputedTextLength() > width; keep--) {
    const head = Math.ceil(keep / 2);
    shown.data = text.slice(0, head) + "…" + text.slice(text.length - (keep - head));
  }
}

function timelineRow(a, i, scale) {
  const { rowH, labelW } = TIMELINE, y = i * rowH + 4, decision = a.decision || 0;
  const group = el("svg:g", { class: "activation", "data-model": a.model, "data-kind": a.kind });
  const what = a.kind === "swap" && a.preempted ? `swap ${a.preempted} → ${a.model}` : `${a.kind.replace("_", " ")} ${a.model}`;
  const label = el("svg:text", { x: 4, y: y + 14, class: "label" });
  group.append(label);
  for (const s of a.stages) {
    const start = Math.max(0, s.start), queued = s.stage === "queue" ? " (requests waiting before the decision)" : "";
    const bar = el("svg:rect", { x: labelW + start * scale, y, width: Math.max(1, (s.end - start) * scale), height: rowH - 8,
      fill: STAGE_COLORS[s.stage] || "#999", class: "stage", "data-stage": s.stage });
    bar.append(el("svg:title", {}, `${s.stage}: ${seconds(s.end - s.start)}${queued}`));
    group.append(bar);
  }
  if (decision > 0) {
    const mark = el("svg:line", { x1: labelW + decision * scale, x2: labelW + decision * scale, y1: y - 2, y2: y + rowH - 6, class: "decision" });
    mark.append(el("svg:title", {}, `${a.kind.replace("_", " ")} decided after ${seconds(decision)} of queueing`));
    group.append(mark);
  }
  const total = seconds(a.seconds) + (decision > 0 ? ` (queued ${seconds(decision)})` : "");
  group.append(el("svg:text", { x: labelW + rowEnd(a) * scale + 6, y: y + 14, class: "total" }, total));
  return { group, label, text: `${clock(a.started_at)}  ${what}${a.result === "success" ? "" : " (failed)"}` };
}

function renderTimeline(activations) {
  const { rowH, labelW, width, right } = TIMELINE, svg = $("timeline"), shown = activations.slice(0, 10);
  const height = Math.max(1, shown.length) * rowH;
  svg.setAttribute("viewBox", `0 0 ${width} ${height + 20}`);
  svg.replaceChildren();
  if (!shown.length) { svg.append(el("svg:text", { x: 4, y: 16 }, "no activations yet")); return; }
  const longest = Math.max(...shown.map(rowEnd), 0.001), scale = (width - labelW - right) / longest;
  svg.append(el("svg:line", { x1: labelW, x2: labelW, y1: 0, y2: height, class: "axis" }));
  shown.forEach((a, i) => {
    const row = timelineRow(a, i, scale);
    svg.append(row.group);
    fitText(row.label, row.text, labelW - 12);
  });
  svg.append(el("svg:text", { x: labelW, y: height + 16 }, "0"),
    el("svg:text", { x: width - right, y: height + 16, "text-anchor": "end" }, seconds(longest)));
}

function renderLegend() {
  const items = Object.entries(STAGE_COLORS).map(([stage, color]) => {
    const item = el("span"); item.append(el("i", { style: "background:" + color }), stage); return item;
  });
  const decision = el("span", { title: "cold start and swap times count from here; queue is the wait before it" });
  decision.append(el("i", { class: "decision" }), "decision");
  $("legend").replaceChildren(...items, decision);
}

function renderLatency(durations) {
  const svg = $("latency"), width = 900, height = 160, bins = 20, left = 40;
  svg.setAttribute("viewBox", `0 0 ${width} ${height + 30}`);
  svg.replaceChildren();
  $("latency-count").textContent = `(${durations.length} recent activations)`;
  if (!durations.length) { svg.append(el("svg:text", { x: 4, y: 16 }, "no activations yet")); return; }
  const top = Math.max(...durations.map((d) => d.seconds)) * 1.0001 || 1, step = top / bins;
  const counts = {};
  for (const kind of Object.keys(KIND_COLORS)) { counts[kind] = new Array(bins).fill(0); }
  for (const d of durations) { (counts[d.kind] || (counts[d.kind] = new Array(bins).fill(0)))[Math.min(bins - 1, Math.floor(d.seconds / step))] += 1; }
  const most = Math.max(1, ...Array.from({ length: bins }, (_, b) => Object.values(counts).reduce((n, c) => n + c[b], 0)));
  const barW = (width - left) / bins;
  for (let b = 0; b < bins; b++) {
    let base = height;
    for (const [kind, c] of Object.entries(counts)) {
      if (!c[b]) { continue; }
      const h = (c[b] / most) * (height - 10);
      const bar = el("svg:rect", { x: left + b * barW + 1, y: base - h, width: barW - 2, height: h, fill: KIND_COLORS[kind] || "#999", class: "bin", "data-kind": kind });
      bar.append(el("svg:title", {}, `${kind}: ${c[b]} between ${seconds(b * step)} and ${seconds((b + 1) * step)}`));
      svg.append(bar); base -= h;
    }
  }
  svg.append(el("svg:text", { x: 4, y: 12 }, String(most)), el("svg:text", { x: left, y: height + 16 }, "0"),
    el("svg:text", { x: width, y: height + 16, "text-anchor": "end" }, seconds(top)),
    el("svg:text", { x: width / 2 - 10, y: height + 16, "text-anchor": "end", style: "fill:" + KIND_COLORS.cold_start }, "■ cold start"),
    el("svg:text", { x: width / 2 + 10, y: height + 16, style: "fill:" + KIND_COLORS.swap }, "■ swap"));
}

function renderErrors(errors) {
  $("errors").replaceChildren(...(errors.length ? errors.slice(0, 20).map((e) =>
    el("li", {}, `${clock(e.at)}  ${e.source}: ${e.message}`)) : [el("li", { class: "muted" }, "none")]));
}

function renderLogChoices(models, available) {
  const select = $("log-model"), keys = models.map((m) => m.key), current = select.value;
  if (select.options.length !== keys.length || keys.some((k, i) => select.options[i].value !== k)) {
    select.replaceChildren(...keys.map((k) => el("option", { value: k }, k)));
    if (keys.includes(current)) { select.value = current; }
  }
  select.disabled = !available;
}

let logsAvailable = true;

async function refreshLog() {
  const model = $("log-model").value;
  if (!logsAvailable) { $("log-tail").textContent = "Model server logs are not available in cluster mode (use kubectl logs)."; return; }
  if (!model) { return; }
  try {
    const body = await getJSON("/ui/api/logs/" + encodeURIComponent(model) + "?tail=200");
    const pre = $("log-tail"), atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = body.lines.length ? body.lines.join("\n") : "(no output yet)";
    if (atBottom) { pre.scrollTop = pre.scrollHeight; }
  } catch (error) { $("log-tail").textContent = String(error.message || error); }
}

async function refresh() {
  try {
    const status = await getJSON("/ui/api/status");
    $("mode").textContent = status.mode + " engine";
    logsAvailable = status.logs_available;
    renderModels(status.models); renderGroups(status.groups); renderMemory(status.memory_groups); renderTimeline(status.activations);
    renderLatency(status.durations); renderErrors(status.errors); renderLogChoices(status.models, logsAvailable);
    $("updated").textContent = "updated " + clock(status.now);
    await refreshLog();
  } catch (error) {
    $("updated").textContent = "error: " + (error.message || error);
  }
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("flexinfer-token", $("token").value);
  $("login").hidden = true;
  refresh();
});
$("log-model").addEventListener("change", refreshLog);
renderLegend();
refresh();
setInterval(refresh, POLL_MS);
