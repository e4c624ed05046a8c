// gpurig's dashboard page: one EventSource (/api/events), a "snapshot" then "delta" events; every value goes in as text, never as HTML.
"use strict";

const KEEP = 300; // points kept per series in the page
const state = { doc: null, live: {} };
// What /api/session says: whether this dashboard allows actions, the anti-CSRF value its POSTs carry, the log lines shown.
const session = { actions: false, csrf: null, log_lines: 200 };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function num(v, unit, digits) {
  return v === null || v === undefined ? "-" : `${Number(v).toFixed(digits || 0)}${unit || ""}`;
}

function when(t) {
  if (!t) return "-";
  const d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
  return isNaN(d) ? String(t) : d.toLocaleString();
}

// A count and its noun in one grammar, as gpurig.errors.counted writes it: 1 host, 2 hosts, 1,500 hosts.
function counted(n, noun) {
  return `${Number(n).toLocaleString("en-US")} ${n === 1 ? noun : noun + "s"}`;
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(s % 60).padStart(2, "0")}s` : `${s}s`;
}

function setWhy(id, section) {
  const node = document.getElementById(id);
  if (!section) { node.textContent = ""; return; }
  const why = section.why ? `: ${section.why}` : "";
  node.textContent = section.state === "known" || section.state === "running" ? why.slice(2) : `${section.state}${why}`;
  node.className = `why ${section.state}`;
}

function fill(tbodyId, rows) {
  const body = document.getElementById(tbodyId);
  body.replaceChildren(...rows);
}

// --- fleet -----------------------------------------------------------------------------------------------------------------------

function verifyCell(v) {
  if (!v || v.state !== "known") return el("td", { class: "unknown", title: v ? v.why : "" }, "unknown");
  const cell = el("td", { class: v.verdict }, `${v.verdict} (${v.level || "?"})`, el("div", { class: "sub" }, when(v.time)));
  if (v.reason) cell.append(el("div", { class: "sub wrap" }, v.reason));
  return cell;
}

function slurmCell(n) {
  if (!n) return el("td", { class: "sub" }, "-");
  if (n.state !== "known") return el("td", { class: "unknown wrap", title: n.why }, "unknown", el("div", { class: "sub wrap" }, n.why));
  const word = n.responding ? n.node : `${n.node}, not responding`;
  const cell = el("td", { class: `wrap ${n.schedules ? "passed" : "failed"}`, "data-slurm": n.node }, word);
  if (n.reason) cell.append(el("div", { class: "sub wrap" }, n.reason));
  if (n.since) cell.append(el("div", { class: "sub" }, `since ${n.since}`));
  return cell;
}

function driftCell(d, checked) {
  if (!d) return el("td", { class: "sub", title: "gpurig dashboard --check shows what provision would change" }, checked ? "-" : "not checked");
  const read = d.read_at ? el("div", { class: "sub" }, `read ${when(d.read_at)}`) : "";
  if (d.state === "unknown") return el("td", { class: "unknown wrap", "data-drift": "unknown" }, "unknown", el("div", { class: "sub wrap" }, d.why), read);
  return el("td", { class: `wrap ${d.state === "in step" ? "passed" : "warn"}`, "data-drift": d.state }, d.text, read);
}

function renderFleet(fleet) {
  setWhy("fleet-why", fleet);
  fill("fleet-rows", fleet.hosts.map((h) => {
    const gpus = h.gpus ? (h.gpus.length ? `${h.gpus.length}x ${[...new Set(h.gpus)].join(", ")}` : h.gpu_note || "none") : "-";
    const sampler = h.sampler.state === "failed" ? el("td", { class: "failed wrap" }, h.sampler.why) : el("td", { class: "running" }, "sampling");
    const reach = el("td", { class: `state ${h.reach}` }, h.reach);
    if (h.reason) reach.append(el("div", { class: "sub wrap" }, h.reason));
    return el("tr", { "data-host": h.host, "data-reach": h.reach, "data-verify": h.verify.state === "known" ? h.verify.verdict : "unknown" },
      el("td", {}, h.host), reach, verifyCell(h.verify), el("td", { class: "wrap" }, gpus), el("td", {}, h.driver || "-"),
      el("td", {}, h.cuda ? `≤ ${h.cuda}` : "-"), el("td", {}, h.os || "-"), sampler, slurmCell(h.slurm),
      driftCell(h.drift, fleet.drift && fleet.drift.checked));
  }));
}

// --- live ------------------------------------------------------------------------------------------------------------------------

function spark(id, points, a, b) {
  // points: [[t, ...values]]; a, b: the value positions drawn (percent, 0..100)
  const svg = svgEl("svg", { class: "spark", viewBox: "0 0 100 28", preserveAspectRatio: "none", "data-series": id, "data-count": "0" });
  svg.append(svgEl("polyline", { class: "util" }), svgEl("polyline", { class: "mem" }));
  drawSpark(svg, points, a, b);
  return svg;
}

function line(points, at) {
  const span = Math.max(points.length - 1, 1);
  return points.map((p, i) => (p[at] === null || p[at] === undefined ? null : `${(100 * i / span).toFixed(2)},${(28 - 27 * Math.min(p[at], 100) / 100).toFixed(2)}`))
    .filter((x) => x !== null).join(" ");
}

function drawSpark(svg, points, a, b) {
  const shown = points.slice(-120);
  svg.children[0].setAttribute("points", line(shown, a));
  svg.children[1].setAttribute("points", line(shown, b));
  svg.setAttribute("data-count", String(points.length));
  if (points.length) svg.setAttribute("data-last-t", String(points[points.length - 1][0]));
}

// Who holds a GPU, as the snapshot names them (gpurig.dashboard.snapshot.holders_of): a Slurm job, a container by its name (the
// users of its processes), a process in none; since when on the samples' clock ("≥": it held the GPU before the samples began).
function holderText(h, t) {
  const mib = h.used_mib != null ? ` ${h.used_mib} MiB` : "";
  const since = h.since == null || t == null ? "since unknown" : `since ${h.known ? "" : "≥"}${duration(Math.max(0, t - h.since))}`;
  return `${h.text}${mib} ${since}`;
}

function holderTitle(h) {
  if (h.kind !== "container") return h.kind === "process" ? `pid ${h.pid}, in no container` : `Slurm job ${h.job}`;
  const what = [`container ${h.id.slice(0, 12)}`, h.image ? `image ${h.image}` : "", h.deployed ? `gpurig_containers entry ${h.deployed}${h.user ? ` (user ${h.user})` : ""}` : "",
    `pids ${(h.pids || []).join(", ")}`].filter((x) => x).join(", ");
  const stop = h.no_stop ? `no stop from this page: ${h.no_stop}` : session.actions ? "" : "stopping needs gpurig dashboard --allow-actions";
  return stop ? `${what}. ${stop}` : what;
}

function owners(g, t) {
  if (g.holders) return g.holders.map((h) => holderText(h, t)).join(", ");
  const who = [];
  for (const j of g.jobs || []) who.push(`slurm job ${j.id}${j.user ? ` (${j.user})` : ""}`);
  for (const p of g.processes || []) who.push(`${p.name || "pid " + p.pid}${p.user ? ` (${p.user})` : ""}${p.used_mib != null ? ` ${p.used_mib} MiB` : ""}`);
  return who.join(", ");
}

function stoppable(h) {
  return session.actions && h.kind === "container" && !h.no_stop && h.name;
}

// The holders of a GPU row, drawn in place: the elements (a stop button among them) stay while the same holders do, only
// their text (since when) changes with each sample.
function drawHolders(node, host, g, t, idleText) {
  const holders = g.holders || [];
  const shape = JSON.stringify(holders.map((h) => [h.key, stoppable(h) ? h.name : "", holderTitle(h)]));
  if (node.getAttribute("data-shape") !== shape) {
    node.replaceChildren(el("span", { "data-part": "idle" }));
    holders.forEach((h, i) => {
      const item = el("span", { class: "holder", "data-holder": h.key, "data-kind": h.kind, title: holderTitle(h),
        "data-container": h.kind === "container" ? h.name || h.id : null }, i ? ", " : "", el("span", { "data-part": "text" }));
      if (stoppable(h)) item.append(" ", el("button", { type: "button", "data-stop-host": host, "data-stop-name": h.name }, "stop"));
      node.append(item);
    });
    if (!holders.length) node.append(el("span", { "data-part": "text" }));
    node.setAttribute("data-shape", shape);
  }
  node.querySelector('[data-part="idle"]').textContent = idleText;
  if (!holders.length) { node.querySelector('[data-part="text"]').textContent = owners(g, t); return; }
  holders.forEach((h) => {
    node.querySelector(`[data-holder="${CSS.escape(h.key)}"] [data-part="text"]`).textContent = holderText(h, t);
  });
}

function hostCard(name) {
  const card = el("div", { class: "card", "data-live-host": name });
  card.append(el("h3", {}, el("span", {}, name), el("span", { class: "sub", "data-part": "source" }), el("span", { class: "sub", "data-part": "note" })));
  const row = el("div", { class: "row" }, el("span", { class: "label" }, "host"), el("span", { class: "figs", "data-part": "cpu" }),
    spark(`${name}:host`, [], 1, 2));
  card.append(row, el("div", { "data-part": "gpus" }));
  return card;
}

function gpuRow(host, label) {
  return el("div", { class: "row", "data-gpu": `${host}:${label}` }, el("span", { class: "label" }, `GPU ${label}`),
    el("span", { class: "figs" }), spark(`${host}:gpu${label}`, [], 1, 2), el("span", { class: "owner" }));
}

function renderLive(live) {
  setWhy("live-why", live);
  const box = document.getElementById("live-hosts");
  for (const name of Object.keys(state.live).sort()) {
    const h = state.live[name];
    let card = box.querySelector(`[data-live-host="${CSS.escape(name)}"]`);
    if (!card) { card = hostCard(name); box.append(card); }
    card.querySelector('[data-part="source"]').textContent = h.source && h.source !== "none" ? `gpus: ${h.source}` : "no GPU source";
    card.querySelector('[data-part="note"]').textContent = h.failed ? `failed: ${h.failed}` : (h.notes || []).join("; ");
    const last = h.points[h.points.length - 1];
    card.querySelector('[data-part="cpu"]').textContent = last ? `cpu ${num(last[1], "%")} mem ${num(last[2], "%")}` : "no sample yet";
    drawSpark(card.querySelector(`svg[data-series="${CSS.escape(name + ":host")}"]`), h.points, 1, 2);
    const gpus = card.querySelector('[data-part="gpus"]');
    for (const label of Object.keys(h.gpus).sort((x, y) => parseFloat(x) - parseFloat(y) || x.localeCompare(y))) {
      const g = h.gpus[label];
      let row = gpus.querySelector(`[data-gpu="${CSS.escape(name + ":" + label)}"]`);
      if (!row) { row = gpuRow(name, label); gpus.append(row); }
      const p = g.points[g.points.length - 1] || [];
      row.children[1].textContent = `${num(p[1], "%")} ${num(p[3], "°C")} ${num(p[4], "W")}${p[5] != null ? ` sm ${num(p[5], "%")}` : ""}`;
      row.children[1].title = `${g.name || ""}, memory ${num(p[2], "%")} of ${num(g.mem_total_mib)} MiB`;
      drawSpark(row.children[2], g.points, 1, 2);
      const idleFor = g.idle_since != null && p[0] != null ? p[0] - g.idle_since : 0;
      const flagged = g.idle_since != null && idleFor >= live.idle_after;
      row.setAttribute("data-idle", flagged ? "yes" : "no");
      drawHolders(row.children[3], name, g, p[0], flagged ? `idle ${duration(idleFor)} under 5%, held by ` : "");
      row.children[3].className = flagged ? "owner idle" : "owner";
    }
  }
}

function mergeLive(live, replace) {
  if (replace) state.live = {};
  for (const [name, h] of Object.entries(live.hosts || {})) {
    const have = state.live[name] || (state.live[name] = { points: [], gpus: {} });
    have.points = have.points.concat(h.points).slice(-KEEP);
    for (const [label, g] of Object.entries(h.gpus || {})) {
      const old = have.gpus[label] || { points: [] };
      have.gpus[label] = { ...old, ...g, points: old.points.concat(g.points).slice(-KEEP) };  // a delta names what changed only
    }
    Object.assign(have, { source: h.source, notes: h.notes, failed: h.failed });
  }
}

// --- jobs and history ------------------------------------------------------------------------------------------------------------

function jobActions(j) {
  const cell = el("td", { class: "acts" }, el("a", { href: `/api/jobs/${encodeURIComponent(j.id)}/log?lines=${session.log_lines}`,
    "data-log": j.id, "data-host": j.host }, "log"));
  if (session.actions && (j.state === "running" || j.state === "pending")) {
    cell.append(" ", el("button", { type: "button", "data-cancel": j.id, "data-host": j.host }, "cancel"));
  }
  return cell;
}

function renderJobs(jobs) {
  setWhy("jobs-why", jobs);
  const rows = jobs.jobs.map((j) => el("tr", { "data-job": j.id, "data-state": j.state, "data-exit": j.exit_code },
    el("td", {}, j.host), el("td", {}, j.id, el("div", { class: "sub" }, j.scheduler === "slurm" ? "slurm" : j.name || "")),
    el("td", { class: `state ${j.state} wrap` }, j.state_text), el("td", {}, j.exit_code === null ? "-" : String(j.exit_code)),
    el("td", {}, j.gpus), el("td", {}, duration(j.runtime_s)), el("td", {}, when(j.submitted_at)), el("td", { class: "wrap" }, j.command),
    jobActions(j)));
  for (const u of jobs.unread || []) rows.push(el("tr", { "data-unread": u.host }, el("td", {}, u.host), el("td", {}, "-"),
    el("td", { class: `state ${u.status} wrap`, colspan: 7 }, `${u.status}: ${u.why}`)));
  if (!rows.length && jobs.state === "known") rows.push(el("tr", {}, el("td", { colspan: 9, class: "sub" }, "no jobs on these hosts")));
  fill("jobs-rows", rows);
}

// --- a job's log and the actions -------------------------------------------------------------------------------------------------

const shownLog = { href: null };

async function showLog(href, id, host) {
  shownLog.href = href;
  const panel = document.getElementById("log-panel"), text = document.getElementById("log-text"), said = document.getElementById("log-said");
  panel.hidden = false;
  document.getElementById("log-title").textContent = `log of job ${id} on ${host}`;
  said.textContent = `reading the last ${session.log_lines} lines...`;
  text.setAttribute("data-state", "reading");
  try {
    const answer = await fetch(href, { credentials: "same-origin", cache: "no-store" });
    const body = await answer.text();
    if (shownLog.href !== href) return;  // another log was asked for meanwhile
    if (answer.ok) {
      text.textContent = body;  // a log is untrusted text: never HTML
      said.textContent = body ? `the last ${session.log_lines} lines, read ${new Date().toLocaleTimeString()}` : "the log is empty so far";
      said.className = "sub";
      text.setAttribute("data-state", "shown");
    } else {
      text.textContent = "";
      said.textContent = body.trim() || `HTTP ${answer.status}`;
      said.className = "sub bad";
      text.setAttribute("data-state", "error");
    }
  } catch (err) {
    said.textContent = `the log could not be read: ${err}`;
    said.className = "sub bad";
    text.setAttribute("data-state", "error");
  }
}

function tell(text, cls, what, where) {
  const node = document.getElementById(where || "action-said");
  node.textContent = text;
  node.className = `why ${cls}`;
  node.setAttribute("data-state", what);
}

async function cancelJob(id, host) {
  if (!window.confirm(`Cancel job ${id} on ${host}? Its processes get TERM, then KILL after 10 s (as gpurig cancel ${id}).`)) return;
  tell(`cancelling job ${id} on ${host}...`, "pending", "busy");
  try {
    const answer = await fetch(`/api/jobs/${encodeURIComponent(id)}/cancel`, {
      method: "POST", credentials: "same-origin", cache: "no-store", headers: { "X-Gpurig-CSRF": session.csrf || "" } });
    const body = await answer.text();
    if (answer.ok) {
      const done = JSON.parse(body);
      const more = done.result === "cancelled" || !done.detail ? "" : ` (${done.detail})`;  // "ended already" says how it ended
      tell(`job ${done.job} on ${done.host}: ${done.result}${more}`, "ok", "done");
    } else {
      tell(body.trim() || `HTTP ${answer.status}`, "bad", "refused");
    }
  } catch (err) {
    tell(`job ${id} was not cancelled: ${err}`, "bad", "refused");
  }
}

async function stopContainer(host, name) {
  if (!window.confirm(`Stop container ${name} on ${host}? It gets TERM, then KILL after 30 s; it keeps its settings and deploy starts it again (as gpurig stop -l ${host} --name ${name}).`)) return;
  const where = "gpu-action-said";
  tell(`stopping container ${name} on ${host}...`, "pending", "busy", where);
  try {
    const answer = await fetch(`/api/hosts/${encodeURIComponent(host)}/containers/${encodeURIComponent(name)}/stop`, {
      method: "POST", credentials: "same-origin", cache: "no-store", headers: { "X-Gpurig-CSRF": session.csrf || "" } });
    const body = await answer.text();
    if (answer.ok) {
      const done = JSON.parse(body);
      tell(`container ${done.container} on ${done.host}: ${done.result}${done.result === "stopped" ? "" : ` (${done.detail})`}`, "ok", "done", where);
    } else {
      tell(body.trim() || `HTTP ${answer.status}`, "bad", "refused", where);
    }
  } catch (err) {
    tell(`container ${name} on ${host} was not stopped: ${err}`, "bad", "refused", where);
  }
}

function wireJobs() {
  document.getElementById("live-hosts").addEventListener("click", (e) => {
    const stop = e.target.closest("button[data-stop-name]");
    if (stop) stopContainer(stop.getAttribute("data-stop-host"), stop.getAttribute("data-stop-name"));
  });
  document.getElementById("jobs-rows").addEventListener("click", (e) => {
    const log = e.target.closest("a[data-log]");
    if (log) {
      e.preventDefault();
      showLog(log.getAttribute("href"), log.getAttribute("data-log"), log.getAttribute("data-host"));
      return;
    }
    const cancel = e.target.closest("button[data-cancel]");
    if (cancel) cancelJob(cancel.getAttribute("data-cancel"), cancel.getAttribute("data-host"));
  });
  document.getElementById("log-close").addEventListener("click", () => {
    shownLog.href = null;
    document.getElementById("log-panel").hidden = true;
  });
  document.getElementById("log-refresh").addEventListener("click", () => {
    if (shownLog.href) {
      const title = document.getElementById("log-title").textContent.match(/^log of job (\S+) on (.*)$/) || [];
      showLog(shownLog.href, title[1] || "", title[2] || "");
    }
  });
}

function historyWhat(e) {
  if (e.kind === "action" && e.action === "stop") return [`stop container ${e.container || "?"}${e.host ? ` on ${e.host}` : ""}`,
    `from the dashboard (${e.client || "?"})`, `${e.result}${e.detail && e.result !== "stopped" ? `: ${e.detail}` : ""}`];
  if (e.kind === "action") return [`${e.action} job ${e.job}${e.host ? ` on ${e.host}` : ""}`, `from the dashboard (${e.client || "?"})`,
    `${e.result}${e.detail && e.result !== "cancelled" ? `: ${e.detail}` : ""}`];
  if (e.kind === "rollout") return [`rollout ${e.host}`, e.image, `${e.state}; verify ${e.verify}${e.level ? ` (${e.level})` : ""}${e.reason ? `: ${e.reason}` : ""}`];
  if (e.kind === "verify") return [`verify ${e.host || (e.hosts || []).join(",")}`, e.image, `${e.worst}${e.level ? ` (${e.level})` : ""}${e.reason ? `: ${e.reason}` : ""}`];
  if (e.kind === "idle-stop") {
    const idle = `GPU${e.gpus.length === 1 ? "" : "s"} ${e.gpus.join(",")} idle ${e.idle_s != null ? duration(e.idle_s) : "?"} (idle_stop ${e.idle_stop_s != null ? duration(e.idle_stop_s) : "?"})`;
    return [`idle stop ${e.host} ${e.container}`, e.image, e.stopped ? `stopped: ${idle}` : `not stopped: ${idle}: ${e.reason}`];
  }
  if (e.kind === "promotion") return [`promotion to ${e.alias}`, e.image, `proved on ${counted(e.hosts, "host")}`];
  return [`build ${e.variant}`, e.image, `torch ${e.torch} cuda ${e.cuda}${e.duration_s != null ? `, ${duration(e.duration_s)}` : ""}`];
}

function renderHistory(history) {
  setWhy("history-why", history);
  const rows = history.entries.map((e) => {
    const [what, image, result] = historyWhat(e);
    return el("tr", { "data-kind": e.kind, "data-job": e.job, "data-result": e.result, "data-action": e.action, "data-container": e.container },
      el("td", {}, when(e.time)), el("td", {}, what),
      el("td", { class: "wrap" }, image), el("td", { class: `wrap ${e.verify === "failed" || e.result === "failed" ? "failed" : ""}` }, result));
  });
  for (const u of history.unread || []) rows.push(el("tr", {}, el("td", {}, "-"), el("td", { class: "bad" }, "unreadable"),
    el("td", { class: "wrap" }, u.path), el("td", { class: "wrap" }, u.why)));
  if (!rows.length && history.state === "known") rows.push(el("tr", {}, el("td", { colspan: 4, class: "sub" }, "no rollouts, builds, promotions, verify runs or actions recorded in this project")));
  fill("history-rows", rows);
}

// --- the stream ------------------------------------------------------------------------------------------------------------------

function apply(doc, whole) {
  if (whole) {
    state.doc = doc;
    document.getElementById("selection").textContent = `${counted(doc.selection.length, "host")} from ${doc.inventory}`;
  }
  mergeLive(doc.live, whole);
  renderLive(doc.live);
  if (doc.fleet) renderFleet(doc.fleet);
  if (doc.jobs) renderJobs(doc.jobs);
  if (doc.history) renderHistory(doc.history);
}

function connectionState(word, cls) {
  const node = document.getElementById("conn");
  node.textContent = word;
  node.className = `state ${cls}`;
  node.setAttribute("data-state", word);
}

async function loadSession() {
  try {
    const answer = await fetch("/api/session", { credentials: "same-origin", cache: "no-store" });
    if (answer.ok) Object.assign(session, await answer.json());
  } catch (err) {
    // read-only then: the page still shows everything; no action is offered
  }
}

async function start() {
  wireJobs();
  await loadSession();
  document.body.setAttribute("data-actions", session.actions ? "allowed" : "read-only");
  const events = new EventSource("/api/events");
  events.addEventListener("snapshot", (e) => { apply(JSON.parse(e.data), true); connectionState("live", "ok"); });
  events.addEventListener("delta", (e) => apply(JSON.parse(e.data), false));
  events.onerror = () => connectionState(events.readyState === EventSource.CLOSED ? "closed: reload with the URL from the terminal" : "reconnecting", "bad");
}

document.addEventListener("DOMContentLoaded", start);
