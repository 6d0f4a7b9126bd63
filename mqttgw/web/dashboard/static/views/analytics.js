// Analytics: the pipeline's rollups, published on $analytics/..., as
// charts per topic: messages per minute and per hour, and each field's
// minimum, average and maximum per minute.  The newest window of each
// arrives retained; the page keeps what arrives while it is open.

import { legend, lineChart } from "../chart.js";
import { h } from "../dom.js";

const PREFIX = "$analytics/";
const KEEP = 240;

function decode(payload) {
  try {
    return JSON.parse(new TextDecoder().decode(payload));
  } catch {
    return null;
  }
}

function keep(map, key, window) {
  map.set(key, window);
  if (map.size > KEEP) map.delete(map.keys().next().value);
}

export class Analytics {
  constructor(app) {
    this.app = app;
    this.title = "Analytics";
    // topic -> {minutes: Map(start -> rollup), hours: Map, fields: Map(field -> Map(start -> stats))}
    this.topics = new Map();
    this.chosen = null;
    this.node = h("section.view", { "aria-labelledby": "analytics-title" });
    app.mqtt.subscribe(PREFIX + "#", 0);
    app.mqtt.addEventListener("message", (event) => this.received(event.detail));
  }

  received({ topic, payload }) {
    if (!topic.startsWith(PREFIX)) return;
    const rollup = decode(payload);
    if (!rollup || typeof rollup.topic !== "string" || !rollup.window_start) return;
    const kind = topic.slice(topic.lastIndexOf("/") + 1);
    let entry = this.topics.get(rollup.topic);
    if (!entry) this.topics.set(rollup.topic, entry = { minutes: new Map(), hours: new Map(), fields: new Map() });
    const start = Date.parse(rollup.window_start) / 1000;
    if (rollup.field != null) {
      if (kind !== "1m") return;
      let field = entry.fields.get(rollup.field);
      if (!field) entry.fields.set(rollup.field, field = new Map());
      keep(field, start, rollup);
    } else if (kind === "1m") {
      keep(entry.minutes, start, rollup);
    } else if (kind === "1h") {
      keep(entry.hours, start, rollup);
    } else {
      return;
    }
    if (this.visible) this.draw();
  }

  show() {
    this.visible = true;
    this.draw();
  }

  hide() {
    this.visible = false;
  }

  draw() {
    const names = [...this.topics.keys()].sort();
    if (!this.chosen || !this.topics.has(this.chosen)) this.chosen = names[0] || null;
    const heading = h("h2#analytics-title", { text: "Analytics" });
    if (!names.length) {
      this.node.replaceChildren(heading, h("p.muted", { text: "No rollups yet: they appear when the pipeline publishes on $analytics/#." }));
      return;
    }
    const picker = h("select#analytics-topic", {
      "aria-label": "Topic", onchange: (event) => { this.chosen = event.target.value; this.draw(); },
    }, names.map((name) => h("option", { value: name, selected: name === this.chosen, text: name || "(empty)" })));
    const entry = this.topics.get(this.chosen);
    const sorted = (map, value) => [...map].sort((a, b) => a[0] - b[0]).map(([t, r]) => [t, value(r)]);
    const figure = (caption, series) => h("figure.panel", {}, h("figcaption", { text: caption }), lineChart(series, { title: caption }), legend(series));
    const charts = [
      figure("Messages per minute", [{ label: "messages", points: sorted(entry.minutes, (r) => r.messages) }]),
      figure("Messages per hour", [{ label: "messages", points: sorted(entry.hours, (r) => r.messages) }]),
    ];
    for (const [field, windows] of [...entry.fields].sort()) {
      charts.push(figure(`${field} per minute`, [
        { label: "min", points: sorted(windows, (r) => r.min) },
        { label: "avg", points: sorted(windows, (r) => r.avg) },
        { label: "max", points: sorted(windows, (r) => r.max) },
      ]));
    }
    this.node.replaceChildren(heading, h("div.toolbar", {}, picker), h("div.charts", { "data-topic": this.chosen }, charts));
  }
}
