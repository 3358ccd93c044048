// omlx dashboard: polls GET /v1/dashboard/state and draws it; charts are plain SVG.
// Everything comes from this server; the browser sends the API key it was asked for.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#0b61c4", "#c2410c", "#1a7f37", "#8250df", "#b42318", "#0e7490"];
const SVG = "http://www.w3.org/2000/svg";
let timer = null;
let busy = false;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}

const int = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en"));
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(0) + "%");
const ms = (s) => (s === null || s === undefined ? "–" : (1000 * s).toFixed(0) + " ms");
const time = (t) => new Date(t * 1000).toLocaleTimeString();

function status(text, error) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.className = error ? "error" : "";
}

// Sent back on every call: the server accepts the browser's stored login on an action only
// from this page (its origin, or this token, which another site's page cannot read).
const CSRF = document.querySelector('meta[name="omlx-csrf"]').content;

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json", "x-omlx-csrf": CSRF } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  // From the origin, not the page's URL: that may hold the user name and key the browser
  // was opened with, and fetch refuses URLs with credentials in them.
  const response = await fetch(new URL(path, window.location.origin), init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    const message = (data.error && data.error.message) || response.statusText;
    throw new Error(`${response.status}: ${message}`);
  }
  return data;
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function act(text, method, path, body, done) {
  if (!(await confirmAction(text))) return;
  try {
    status("working…");
    const result = await call(method, path, body);
    status(done(result));
  } catch (err) {
    status(err.message, true);
  }
  refresh();
}

function renderServer(state) {
  const s = state.server;
  const mem = state.memory;
  const limit = mem.limit_bytes ? ` of ${bytes(mem.limit_bytes)}` : "";
  document.getElementById("server").textContent =
    `v${s.version} · up ${Math.round(s.uptime_s)} s · ${s.ready ? "ready" : "loading models"} · ` +
    `models hold ${bytes(mem.held_bytes)}${limit} · ${s.blas || "BLAS unknown"}` +
    (s.role === "tenant" ? ` · tenant ${s.tenant}: your requests, pins and usage` : "");
}

// Unload and clear act on the whole server: an operator's key alone may (a tenant's is refused).
function modelRow(m, operator) {
  const cache = m.cache || {};
  const hot = cache.hot;
  const ssd = m.ssd;
  const images = m.images; // a VLM's image rows: RAM, encoder passes, hits by tier
  const warm = cache.warm_restart; // the start's prefetch of the last run's hot set
  const hitShare = cache.lookup_tokens ? ` (${pct(cache.hit_tokens / cache.lookup_tokens)})` : "";
  const hits = cache.enabled ? `${int(cache.hit_tokens)} of ${int(cache.lookup_tokens)}${hitShare}` :
    (cache.disabled_reason ? `off (${cache.disabled_reason})` : "–");
  const perToken = ssd && ssd.bytes_per_token ? `${int(Math.round(ssd.bytes_per_token))} B on disk` :
    (m.kv_bytes_per_token ? `${int(m.kv_bytes_per_token)} B in RAM` : "–");
  const actions = el("div", { class: "actions" });
  if (m.state === "loaded" && operator) {
    actions.append(el("button", {
      type: "button", class: "unload", disabled: m.pinned, "data-key": `unload:${m.id}`, title: m.pinned ? "pinned with --pin-model" : null,
      "aria-label": `Unload ${m.id}`,
      onclick: () => act(`Unload ${m.id}? Its cached blocks on disk stay.`, "POST",
        `/v1/dashboard/models/${encodeURIComponent(m.id)}/unload`, {}, () => `unloaded ${m.id}`),
    }, "Unload"));
  }
  if (m.task === "chat" && operator) {
    actions.append(el("button", {
      type: "button", class: "danger clear", "data-key": `clear:${m.id}`, "aria-label": `Clear the cache of ${m.id}`,
      onclick: () => act(`Delete every cached block of ${m.id}, in RAM and on disk?`, "POST",
        `/v1/dashboard/models/${encodeURIComponent(m.id)}/clear-cache`, {},
        (r) => `cleared ${m.id}: ${int(r.hot_blocks)} hot and ${int(r.ssd_blocks)} SSD blocks (${bytes(r.ssd_bytes)})`),
    }, "Clear cache"));
  }
  const state = el("span", { class: `state-${m.state}` }, m.state, m.pinned ? " (pinned)" : "");
  return el("tr", { "data-model": m.id },
    el("th", { scope: "row" }, m.id, el("div", { class: "muted" }, m.task)),
    el("td", {}, state, m.error ? el("div", { class: "muted" }, m.error) : null),
    el("td", { class: "num" }, m.state === "loaded" ? `${bytes(m.weights_bytes)} + ${bytes(m.kv_bytes)}` : "–"),
    el("td", { class: "num" }, `${m.active} / ${m.queued}`),
    el("td", { class: "num hot" }, hot ? `${int(hot.blocks)} blocks, ${bytes(hot.bytes)}` : "–",
      warm && warm.state !== "off" && warm.blocks_total ? el("div", { class: "muted warm-restart" },
        `warm restart ${warm.state}: ${int(warm.blocks)} of ${int(warm.blocks_total)} blocks read back, ` +
        `${bytes(warm.bytes)} in ${warm.seconds.toFixed(1)} s` + (warm.skipped ? `, ${int(warm.skipped)} skipped` : "")) : null,
      images ? el("div", { class: "muted images-hot" }, `of which ${int(images.images)} images' rows, ${bytes(images.bytes)}`) : null),
    el("td", { class: "num ssd" }, ssd ? `${int(ssd.blocks)} blocks, ${bytes(ssd.bytes)}` : "–",
      ssd && images ? el("div", { class: "muted images-ssd" }, `of which ${int(ssd.image_objects)} images' rows, ${bytes(ssd.image_bytes)}`) : null),
    el("td", { class: "num" }, perToken),
    el("td", { class: "num hits", title: cache.enabled ? `${int(cache.lookups)} lookups` : null }, hits,
      images ? el("div", { class: "muted images-encoder" },
        `images: ${int(images.encoder_passes)} encoder passes, ${int(images.ram_hits)} rows from RAM, ${int(images.ssd_hits)} from SSD`) : null),
    el("td", {}, actions));
}

function meterCard(title, used, max, lines) {
  const share = max ? Math.min(used / max, 1) : 0;
  return [
    el("h3", {}, title),
    el("meter", { min: 0, max: 1, value: share, low: 0.8, high: 0.95, optimum: 0.5,
      "aria-label": `${title}: ${pct(share)} of its budget` }),
    el("p", {}, `${bytes(used)} of ${max ? bytes(max) : "no limit"} (${pct(share)})`),
    ...lines.map((line) => el("p", { class: "muted" }, line)),
  ];
}

function renderTiers(state) {
  const hot = state.tiers.hot;
  const ssd = state.tiers.ssd;
  document.getElementById("tier-hot").replaceChildren(...meterCard("Hot tier (RAM)", hot.bytes, hot.max_bytes,
    [`${int(hot.blocks)} blocks; budget ${hot.max_bytes_per_model == null
      ? "sized per model (auto)" : `${bytes(hot.max_bytes_per_model)} per loaded model`}`]));
  const ssdCard = document.getElementById("tier-ssd");
  if (!ssd.enabled || ssd.unavailable) {
    ssdCard.replaceChildren(el("h3", {}, "SSD tier"), el("p", {}, ssd.unavailable || "off"));
  } else {
    const perToken = ssd.tokens ? `${int(Math.round(ssd.bytes / ssd.tokens))} bytes per token` : "no blocks yet";
    ssdCard.replaceChildren(...meterCard("SSD tier", ssd.bytes, ssd.max_bytes, [
      `${int(ssd.blocks)} blocks, ${int(ssd.tokens)} tokens, ${ssd.namespaces.length} namespace${ssd.namespaces.length === 1 ? "" : "s"}; ${perToken}`,
      `${int(ssd.write_queue)} blocks queued for disk · ${ssd.dir}${ssd.shared ? " (shared index)" : ""}`,
    ]));
    document.querySelector("#namespaces tbody").replaceChildren(...ssd.namespaces.map((ns) => el("tr", {},
      el("td", {}, ns.model), el("td", { title: ns.namespace }, ns.namespace.slice(0, 12)),
      el("td", { class: "num" }, ns.block_size), el("td", { class: "num" }, int(ns.blocks)),
      el("td", { class: "num" }, int(ns.tokens)), el("td", { class: "num" }, bytes(ns.bytes)),
      el("td", { class: "num" }, ns.image_objects ? `${int(ns.image_objects)}, ${bytes(ns.image_bytes)}` : "–"),
      el("td", { class: "num" }, ns.bytes_per_token ? int(Math.round(ns.bytes_per_token)) : "–"))));
  }
  const q = state.queue;
  document.getElementById("queue").replaceChildren(
    el("h3", {}, "Requests now"),
    el("p", { id: "active" }, `${q.active} active of ${q.max_concurrent} per model's batch`),
    el("p", { id: "queued" }, `${q.queued} queued (429 past ${q.max_queued})`));
  document.getElementById("vacuum-form").hidden = !ssd.enabled;
}

function chart(title, series, value, format, maxValue) {
  const W = 320, H = 150, L = 44, R = 8, T = 8, B = 22;
  const all = Object.values(series).flat();
  const values = all.map(value).filter((v) => v !== null && v !== undefined);
  const t0 = Math.min(...all.map((p) => p.at)), t1 = Math.max(...all.map((p) => p.at));
  const top = maxValue !== undefined ? maxValue : Math.max(1e-9, ...values) * 1.1;
  const x = (t) => (t1 > t0 ? L + ((t - t0) / (t1 - t0)) * (W - L - R) : (L + W - R) / 2);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
    "aria-label": `${title} over time, ${values.length} points` });
  root.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
    svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }));
  for (const [v, label] of [[0, format(0)], [top, format(top)]]) {
    const text = svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" });
    text.textContent = label;
    root.append(text);
  }
  if (all.length) {
    for (const [t, anchor] of [[t0, "start"], [t1, "end"]]) {
      const text = svg("text", { x: x(t), y: H - 6, "text-anchor": anchor });
      text.textContent = time(t);
      root.append(text);
    }
  }
  Object.entries(series).forEach(([model, points], i) => {
    const color = COLORS[i % COLORS.length];
    const shown = points.filter((p) => value(p) !== null && value(p) !== undefined);
    if (shown.length > 1) {
      root.append(svg("polyline", { class: "line", stroke: color,
        points: shown.map((p) => `${x(p.at).toFixed(1)},${y(value(p)).toFixed(1)}`).join(" ") }));
    }
    for (const p of shown) {
      const dot = svg("circle", { class: "point", cx: x(p.at).toFixed(1), cy: y(value(p)).toFixed(1), r: 3, fill: color });
      const tip = svg("title", {});
      tip.textContent = `${model} at ${time(p.at)}: ${format(value(p))} (${p.requests} requests)`;
      dot.append(tip);
      root.append(dot);
    }
  });
  const legend = el("ul", { class: "legend" }, Object.keys(series).map((model, i) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = COLORS[i % COLORS.length];
    return el("li", {}, swatch, model);
  }));
  return el("figure", { class: "card", "data-chart": title }, el("h3", {}, title), root, legend);
}

function renderCharts(state) {
  const series = state.series;
  document.getElementById("charts-note").textContent =
    `One point per model every ${state.server.sample_seconds} s that had finished requests.`;
  document.getElementById("charts").replaceChildren(
    // A hit restores more than the chat template's fixed preamble, which every request does.
    chart("Hit rate (past the template's preamble)", series, (p) => p.hit_rate, pct, 1),
    chart("Cached share of prompt tokens", series, (p) => p.cached_share, pct, 1),
    chart("Time to first token (median)", series, (p) => (p.ttft_ms === null ? null : p.ttft_ms / 1000), ms));
}

function renderRequests(state) {
  document.querySelector("#requests tbody").replaceChildren(...state.requests.map((r) => el("tr", {},
    el("td", {}, time(r.at)), el("td", {}, r.model),
    el("td", { title: r.route }, `${r.api} ${r.route}`),
    el("td", { class: "num" }, int(r.prompt_tokens)), el("td", { class: "num cached" }, int(r.cached_tokens)),
    el("td", { class: `tier tier-${r.tier}` }, r.tier), el("td", { class: "num" }, ms(r.ttft_s)),
    el("td", { class: "num" }, r.tokens_per_s === null ? "–" : r.tokens_per_s.toFixed(1)),
    el("td", {}, r.reason), divergenceCell(r.divergence, r.outcome))));
}

// Where a prompt left the cache and why (the report's outcome): its token offset and the
// message it falls in.
function divergenceCell(d, outcome) {
  if (!d) return el("td", { class: "diverged" }, outcome || "–");
  const where = d.message === null ? "" : `, message ${d.message} (${d.part || d.role})`;
  const tip = `the prompt goes on ${JSON.stringify(d.prompt)}` +
    (d.cached ? `; the cache holds ${JSON.stringify(d.cached)}` : "; the cache ends there");
  const why = outcome ? `${outcome.replace("_", " ")}: ` : "";
  return el("td", { class: "diverged", title: tip }, `${why}token ${int(d.at)}${where}`);
}

function duration(s) {
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  if (s >= 60) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(s)} s`;
}

function renderPins(state) {
  const rows = Object.entries(state.pins).flatMap(([model, pins]) => pins.map((p) => el("tr", { "data-pin": p.id },
    el("td", {}, model), el("td", { title: p.id }, el("code", {}, p.id.slice(0, 12))),
    el("td", { class: "num" }, int(p.tokens)), el("td", { class: "num" }, `${int(p.blocks)} (${int(p.held_blocks)})`),
    el("td", { class: "num ttl", title: `until ${new Date(p.expires_at * 1000).toLocaleString()}` }, duration(p.ttl_left_s)),
    el("td", {}, p.source, p.group ? el("div", { class: "muted" }, p.group) : null),
    el("td", {}, el("button", {
      type: "button", class: "danger unpin", "data-key": `unpin:${p.id}`, "aria-label": `Unpin ${p.id.slice(0, 12)} of ${model}`,
      onclick: () => act(`Unpin ${int(p.tokens)} tokens of ${model}? They become plain LRU blocks again.`, "POST",
        `/v1/dashboard/pins/${encodeURIComponent(p.id)}/unpin`, {}, () => `unpinned ${p.id.slice(0, 12)} of ${model}`),
    }, "Unpin")))));
  const empty = el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No pins."));
  document.querySelector("#pins tbody").replaceChildren(...(rows.length ? rows : [empty]));
}

async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const state = await call("GET", "/v1/dashboard/state");
    // The tables are redrawn: keep the keyboard focus on the same button.
    const focused = document.activeElement && document.activeElement.dataset.key;
    renderServer(state);
    const operator = state.server.role === "operator";
    document.querySelector("#models tbody").replaceChildren(...state.models.map((m) => modelRow(m, operator)));
    // The tiers' contents and the vacuum are the operator's: a tenant's page has no such section.
    document.getElementById("tiers").hidden = !operator;
    if (operator) renderTiers(state);
    renderCharts(state);
    renderRequests(state);
    renderPins(state);
    if (focused) {
      const again = document.querySelector(`[data-key="${CSS.escape(focused)}"]`);
      if (again) again.focus();
    }
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.updated = String(Date.now());
  } catch (err) {
    document.getElementById("updated").textContent = `could not read the state: ${err.message}`;
  } finally {
    busy = false;
  }
}

function schedule() {
  clearInterval(timer);
  timer = document.hidden ? null : setInterval(refresh, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("vacuum-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const size = document.getElementById("vacuum-size").value.trim();
    act(`Evict least recently used blocks until the SSD tier holds at most ${size}?`, "POST",
      "/v1/dashboard/vacuum", { max_size: size },
      (r) => `vacuumed: ${bytes(r.freed_bytes)} freed (${r.report.join("; ")})`);
  });
  document.addEventListener("visibilitychange", () => { schedule(); if (!document.hidden) refresh(); });
  refresh();
  schedule();
});
