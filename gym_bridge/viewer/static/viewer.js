// gym-bridge view: the few bits that need a script (token colour mode, run curves). No libraries.
"use strict";

function tokenModes() {
  const view = document.getElementById("token-view");
  document.querySelectorAll('input[name="mode"]').forEach((radio) => {
    radio.addEventListener("change", () => { view.className = "mode-" + radio.value; });
  });
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

function niceNumber(v) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return (Math.round(v * 1000) / 1000).toString();
}

// series: [{label, points: [[step, value], ...], colour}]
function drawChart(container, title, series) {
  const W = 420, H = 220, L = 48, R = 10, T = 24, B = 28;
  const box = document.createElement("figure");
  box.className = "chart";
  box.dataset.title = title;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
  const all = series.flatMap((s) => s.points);
  const caption = document.createElement("figcaption");
  const last = series.map((s) => s.points.length ? `${s.label} ${niceNumber(s.points[s.points.length - 1][1])}` : "").filter(Boolean);
  caption.textContent = title + (last.length ? " · latest: " + last.join(", ") : " · no data yet");
  if (all.length) {
    let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    svg.appendChild(svgEl("rect", { x: L, y: T, width: W - L - R, height: H - T - B, class: "plot" }));
    for (const frac of [0, 0.5, 1]) {
      const y = y0 + frac * (y1 - y0);
      svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "grid" }));
      const t = svgEl("text", { x: L - 4, y: sy(y) + 4, class: "tick", "text-anchor": "end" });
      t.textContent = niceNumber(y);
      svg.appendChild(t);
    }
    for (const x of [x0, x1]) {
      const t = svgEl("text", { x: sx(x), y: H - 8, class: "tick", "text-anchor": "middle" });
      t.textContent = Math.round(x);
      svg.appendChild(t);
    }
    series.forEach((s) => {
      if (!s.points.length) return;
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
      svg.appendChild(svgEl("path", { d, class: "line", stroke: s.colour }));
      if (s.points.length < 40) s.points.forEach((p) => svg.appendChild(svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: s.colour })));
    });
  }
  box.appendChild(caption);
  box.appendChild(svg);
  container.appendChild(box);
}

const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

function seriesFor(records, split, key) {
  const out = {};
  for (const r of records) {
    if (r.split !== split) continue;
    for (const [k, v] of Object.entries(r)) {
      const match = key.endsWith("*") ? k.startsWith(key.slice(0, -1)) : k === key;
      if (match && typeof v === "number" && isFinite(v)) (out[k] = out[k] || []).push([r.step, v]);
    }
  }
  return Object.entries(out).sort().map(([label, points], i) => ({ label, points, colour: COLOURS[i % COLOURS.length] }));
}

function runPage() {
  const charts = document.getElementById("charts");
  const curves = JSON.parse(charts.dataset.curves);
  const extra = document.getElementById("extra-metric");
  const extraBox = document.getElementById("extra-chart");
  const status = document.getElementById("run-status");
  const steps = document.getElementById("steps");
  let records = [], next = 0, known = new Set();

  function render() {
    charts.replaceChildren();
    for (const [title, split, key] of curves) drawChart(charts, title, seriesFor(records, split, key));
    const keys = new Set();
    records.forEach((r) => Object.entries(r).forEach(([k, v]) => { if (typeof v === "number" && k !== "step") keys.add(r.split + "/" + k); }));
    for (const k of [...keys].sort()) if (!known.has(k)) {
      known.add(k);
      const o = document.createElement("option"); o.value = k; o.textContent = k; extra.appendChild(o);
    }
    extraBox.replaceChildren();
    if (extra.value) {
      const [split, ...rest] = extra.value.split("/");
      drawChart(extraBox, extra.value, seriesFor(records, split, rest.join("/")));
    }
    const trainSteps = records.filter((r) => r.split === "train").map((r) => r.step);
    status.textContent = `${records.length} metric records · last step ${trainSteps.length ? Math.max(...trainSteps) : "–"} · refreshed ${new Date().toLocaleTimeString()}`;
  }

  function renderSteps(stepList) {
    if (!stepList.length) return;
    steps.replaceChildren(...stepList.map((s) => {
      const li = document.createElement("li"), a = document.createElement("a");
      a.href = "/f/step_" + String(s).padStart(6, "0"); a.textContent = "step " + s;
      li.appendChild(a); return li;
    }));
  }

  async function poll() {
    try {
      const res = await fetch(`/api/run/metrics?after=${next}`, { credentials: "same-origin" });
      if (res.ok) {
        const body = await res.json();
        if (body.next < next) { records = []; }
        records = records.concat(body.records);
        next = body.next;
        render();
        renderSteps(body.sample_steps);
      }
    } catch (e) { status.textContent = "could not refresh: " + e; }
  }
  extra.addEventListener("change", render);
  poll();
  setInterval(poll, 2000);
}

// Started from here, not from an inline <script>: the Content-Security-Policy runs only this file.
if (document.getElementById("token-view")) tokenModes();
if (document.getElementById("charts")) runPage();
