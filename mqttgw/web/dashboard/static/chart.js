// Small SVG charts: a line chart with axes for the Overview and Analytics
// views, and a sparkline for a topic's numeric fields.

const SVG = "http://www.w3.org/2000/svg";

function svg(name, attributes = {}) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  return node;
}

function path(points, x, y) {
  return points.map(([a, b], i) => `${i ? "L" : "M"}${x(a).toFixed(1)},${y(b).toFixed(1)}`).join("");
}

export function formatNumber(n) {
  if (n == null || Number.isNaN(n)) return "–";
  const abs = Math.abs(n);
  if (abs >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (abs >= 1e4) return (n / 1e3).toFixed(1) + "k";
  if (abs >= 100 || Number.isInteger(n)) return String(Math.round(n));
  return n.toFixed(2);
}

// series: [{label, points: [[x, y]...], className}]; x is epoch seconds.
export function lineChart(series, { width = 640, height = 180, title = "" } = {}) {
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img" });
  chart.append(svg("title"));
  chart.firstChild.textContent = title;
  const all = series.flatMap((s) => s.points);
  const left = 48, bottom = 20, top = 8, right = 8;
  if (!all.length) {
    const empty = svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "muted" });
    empty.textContent = "no data yet";
    chart.append(empty);
    return chart;
  }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y0 = Math.min(0, ...ys), y1 = Math.max(...ys, y0 + 1);
  const x = (v) => left + ((v - x0) / (x1 - x0)) * (width - left - right);
  const y = (v) => height - bottom - ((v - y0) / (y1 - y0)) * (height - top - bottom);
  for (const v of [y0, (y0 + y1) / 2, y1]) {
    chart.append(svg("line", { x1: left, x2: width - right, y1: y(v), y2: y(v), class: "grid" }));
    const label = svg("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end", class: "axis" });
    label.textContent = formatNumber(v);
    chart.append(label);
  }
  for (const v of [x0, x1]) {
    const label = svg("text", { x: x(v), y: height - 4, "text-anchor": v === x0 ? "start" : "end", class: "axis" });
    label.textContent = new Date(v * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    chart.append(label);
  }
  series.forEach((s, i) => {
    chart.append(svg("path", { d: path(s.points, x, y), class: `line line${i} ${s.className || ""}` }));
    // Few points (a rollup per minute, just begun) are drawn as dots too.
    if (s.points.length <= 60) {
      for (const [a, b] of s.points) chart.append(svg("circle", { cx: x(a), cy: y(b), r: 2.5, class: `dot dot${i}` }));
    }
  });
  return chart;
}

export function legend(series) {
  const list = document.createElement("ul");
  list.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("li");
    item.className = `key${i}`;
    item.textContent = s.label;
    list.append(item);
  });
  return list;
}

// values: numbers, oldest first.
export function sparkline(values, width = 80, height = 18) {
  const line = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "spark", "aria-hidden": "true" });
  if (values.length < 2) return line;
  const lo = Math.min(...values), hi = Math.max(...values, lo + 1e-9);
  const points = values.map((v, i) => [i, v]);
  const x = (i) => (i / (values.length - 1)) * width;
  const y = (v) => height - 1 - ((v - lo) / (hi - lo)) * (height - 2);
  line.append(svg("path", { d: path(points, x, y), class: "line line0" }));
  return line;
}
