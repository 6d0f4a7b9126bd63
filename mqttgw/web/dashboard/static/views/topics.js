// Topics: every topic the page may read, as a tree, with its last payload,
// rate, retained flag and age.  A message only updates the topic's entry;
// the tree is drawn at most twice a second and only its open branches, so
// thousands of topics updating stay cheap.

import { sparkline } from "../chart.js";
import { age, h, notice } from "../dom.js";

const DRAW_EVERY = 500;
const MAX_ROWS = 400;
const RATE_WINDOW = 10; // seconds: the rate shown is an average over about this
const SPARK_POINTS = 30;
const PREVIEW = 120;
const decoder = new TextDecoder("utf-8", { fatal: true });

class Node {
  constructor(name, path) {
    this.name = name;
    this.path = path;
    this.children = new Map();
    this.entry = null;
    this.topics = 0;
    this.updated = 0;
    this.open = false;
  }
}

// Whether topic matches an MQTT filter (+ and #), or, with neither, holds it.
export function matches(filter, topic) {
  if (!filter.includes("+") && !filter.includes("#")) return topic.includes(filter);
  const want = filter.split("/"), have = topic.split("/");
  for (let i = 0; i < want.length; i++) {
    if (want[i] === "#") return true;
    if (i >= have.length || (want[i] !== "+" && want[i] !== have[i])) return false;
  }
  return want.length === have.length;
}

// What a payload shows: {text, json (parsed or undefined), binary}.
export function describe(payload) {
  let text;
  try {
    text = decoder.decode(payload);
  } catch {
    const hex = Array.from(payload.subarray(0, 48), (b) => b.toString(16).padStart(2, "0")).join(" ");
    return { text: hex + (payload.length > 48 ? " …" : ""), binary: true };
  }
  let json;
  const first = text.trimStart()[0];
  if (first === "{" || first === "[" || (first && "-0123456789".includes(first))) {
    try { json = JSON.parse(text); } catch { json = undefined; }
  }
  return { text, json, binary: false };
}

function numericFields(json) {
  if (typeof json === "number") return [["value", json]];
  if (json && typeof json === "object" && !Array.isArray(json)) {
    return Object.entries(json).filter(([, v]) => typeof v === "number" && Number.isFinite(v));
  }
  return [];
}

function cut(text, n) {
  return text.length > n ? text.slice(0, n) + "…" : text;
}

export class Topics {
  constructor(app) {
    this.app = app;
    this.title = "Topics";
    this.root = new Node("", "");
    this.count = 0;
    this.filter = "";
    this.selected = null;
    this.visible = false;
    this.dirty = true;
    this.build();
    app.mqtt.subscribe("#", 0);
    app.mqtt.addEventListener("message", (event) => this.received(event.detail));
  }

  build() {
    const filter = h("input#topic-filter", {
      type: "search", placeholder: "filter: text or a pattern like plant/+/temp",
      "aria-label": "Filter topics", autocomplete: "off",
      oninput: (event) => { this.filter = event.target.value.trim(); this.draw(); },
    });
    this.summary = h("p.muted#topic-count", { "aria-live": "polite" });
    this.list = h("div.tree#topic-tree", { role: "tree", "aria-label": "Topics" });
    this.detail = h("div.detail#topic-detail");
    this.publisher = this.app.session.role === "admin" ? this.publishForm() : null;
    this.node = h("section.view", { "aria-labelledby": "topics-title" },
      h("h2#topics-title", { text: "Topics" }),
      h("div.toolbar", {}, filter, this.summary),
      h("div.split", {}, this.list, this.detail),
      this.publisher,
    );
  }

  publishForm() {
    const topic = h("input", { name: "topic", required: true, "aria-label": "Topic", placeholder: "topic" });
    const payload = h("input", { name: "payload", "aria-label": "Payload", placeholder: "payload" });
    const retain = h("input", { type: "checkbox", name: "retain", id: "publish-retain" });
    const form = h("form.publish#publish-form", {
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          await this.app.mqtt.publish(topic.value, payload.value, { qos: 1, retain: retain.checked });
          notice(`Published to ${topic.value}.`);
        } catch (e) {
          notice(`Not published: ${e.message}`, "error");
        }
      },
    },
    h("h3", { text: "Publish" }), topic, payload,
    h("label", { for: "publish-retain" }, retain, " retain"),
    h("button", { type: "submit", text: "Publish" }));
    return form;
  }

  received({ topic, payload, retain }) {
    // "#" matches no $ topic: those come from other views' subscriptions.
    if (topic[0] === "$") return;
    const now = performance.now() / 1000;
    let node = this.root, created = false;
    const levels = topic.split("/");
    const path = [];
    for (let i = 0; i < levels.length; i++) {
      node.updated = now;
      let child = node.children.get(levels[i]);
      if (!child) {
        child = new Node(levels[i], levels.slice(0, i + 1).join("/"));
        node.children.set(levels[i], child);
        created = true;
      }
      path.push(node);
      node = child;
    }
    node.updated = now;
    let entry = node.entry;
    if (!entry) {
      entry = node.entry = { topic, rate: 0, seen: now, fields: new Map(), count: 0 };
      this.count++;
      for (const parent of path) parent.topics++;
      node.topics++;
    }
    // An exponentially decaying average of messages per second.
    entry.rate = entry.rate * Math.exp((entry.seen - now) / RATE_WINDOW) + 1 / RATE_WINDOW;
    entry.seen = now;
    entry.count++;
    entry.payload = payload;
    entry.shown = null;
    // An empty retained message clears the topic.
    entry.retained = retain && payload.length > 0;
    if (payload.length && payload.length < 2048 && (payload[0] === 0x7b || (payload[0] >= 0x2d && payload[0] <= 0x39))) {
      const { json } = describe(payload);
      entry.shown = null;
      for (const [field, value] of numericFields(json)) {
        let values = entry.fields.get(field);
        if (!values) entry.fields.set(field, values = []);
        values.push(value);
        if (values.length > SPARK_POINTS) values.shift();
      }
    }
    this.dirty = this.dirty || created || this.visible;
    this.schedule();
  }

  schedule() {
    if (!this.visible || this.pending) return;
    const wait = Math.max(0, (this.drawn || 0) + DRAW_EVERY - performance.now());
    this.pending = setTimeout(() => requestAnimationFrame(() => { this.pending = null; this.draw(); }), wait);
  }

  show() {
    this.visible = true;
    this.draw();
    // Ages move on even when nothing arrives.
    this.ticker = setInterval(() => this.schedule(), 1000);
  }

  hide() {
    this.visible = false;
    clearInterval(this.ticker);
  }

  rows() {
    const now = performance.now() / 1000;
    const out = [];
    if (this.filter) {
      const walk = (node) => {
        if (out.length >= MAX_ROWS) return;
        if (node.entry && matches(this.filter, node.path)) out.push(this.row(node, 0, now, false));
        for (const child of node.children.values()) walk(child);
      };
      walk(this.root);
      return out;
    }
    const walk = (node, depth) => {
      const children = [...node.children.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
      for (const child of children) {
        if (out.length >= MAX_ROWS) return;
        out.push(this.row(child, depth, now, child.children.size > 0));
        if (child.open) walk(child, depth + 1);
      }
    };
    walk(this.root, 0);
    return out;
  }

  row(node, depth, now, branch) {
    const entry = node.entry;
    const name = this.filter ? node.path : node.name || "(empty)";
    const toggle = branch
      ? h("button.toggle", {
        "aria-expanded": node.open ? "true" : "false",
        "aria-label": `${node.open ? "Close" : "Open"} ${node.path}`,
        text: node.open ? "▾" : "▸",
        onclick: () => { node.open = !node.open; this.draw(); },
      })
      : h("span.toggle");
    const cells = [toggle, h("button.name", {
      text: name, title: node.path,
      onclick: () => { this.selected = node; this.draw(); },
    })];
    if (entry) {
      if (!entry.shown) {
        const described = describe(entry.payload);
        entry.shown = { text: cut(described.json !== undefined ? JSON.stringify(described.json) : described.text, PREVIEW), binary: described.binary };
      }
      const rate = entry.rate * Math.exp((entry.seen - now) / RATE_WINDOW);
      cells.push(
        h(`code.payload${entry.shown.binary ? ".binary" : ""}`, { text: entry.shown.text }),
        h("span.rate", { text: `${rate >= 10 ? rate.toFixed(0) : rate.toFixed(1)}/s` }),
        entry.retained ? h("span.badge.retained", { text: "retained", title: "retained" }) : h("span"),
        h("span.age", { text: age(now - entry.seen) }),
        ...[...entry.fields].slice(0, 2).map(([field, values]) => h("span.sparkbox", { title: field }, sparkline(values))),
      );
    } else {
      cells.push(h("span.muted", { text: `${node.topics} topic${node.topics === 1 ? "" : "s"}` }), h("span.age", { text: age(now - node.updated) }));
    }
    const row = h(`div.row${this.selected === node ? ".selected" : ""}`, {
      role: "treeitem", "aria-level": depth + 1, "data-topic": node.path,
      "aria-expanded": branch ? String(node.open) : null,
    }, cells);
    // Through the CSSOM: the page's policy allows no inline style attribute.
    row.style.setProperty("--depth", depth);
    return row;
  }

  drawDetail() {
    const node = this.selected;
    if (!node || !node.entry) {
      this.detail.replaceChildren(h("p.muted", { text: "Choose a topic to see its last message." }));
      return;
    }
    const entry = node.entry;
    const described = describe(entry.payload);
    const text = described.json !== undefined ? JSON.stringify(described.json, null, 2) : described.text;
    const admin = this.app.session.role === "admin";
    this.detail.replaceChildren(...[
      h("h3", { text: node.path }),
      h("p.muted", { text: `${entry.payload.length} bytes${described.binary ? " (binary, as hex)" : ""}, ${entry.count} messages seen${entry.retained ? ", retained" : ""}` }),
      h("pre.payload", { text: cut(text, 20000) }),
      ...[...entry.fields].map(([field, values]) => h("p.field", {}, `${field}: ${values[values.length - 1]} `, sparkline(values, 160, 28))),
      admin && entry.retained ? h("button.danger", {
        text: "Clear retained",
        onclick: async () => {
          try {
            await this.app.session.api(`retained?filter=${encodeURIComponent(node.path)}`, { method: "DELETE" });
            notice(`Retained message on ${node.path} cleared.`);
          } catch (e) {
            notice(e.message, "error");
          }
        },
      }) : null,
    ].filter(Boolean));
  }

  draw() {
    if (!this.visible) return;
    this.drawn = performance.now();
    this.dirty = false;
    const rows = this.rows();
    // Drawing anew must not take the keyboard's place away.
    const focused = document.activeElement;
    const row = focused && this.list.contains(focused) ? focused.closest(".row") : null;
    const again = row && [row.dataset.topic, focused.className];
    this.list.replaceChildren(...rows);
    if (again) {
      const same = [...this.list.children].find((r) => r.dataset.topic === again[0]);
      const button = same && same.querySelector(`button.${again[1].split(" ")[0]}`);
      if (button) button.focus();
    }
    this.summary.textContent = `${this.count} topic${this.count === 1 ? "" : "s"}${rows.length >= MAX_ROWS ? `, first ${MAX_ROWS} shown` : ""}`;
    this.drawDetail();
  }
}
