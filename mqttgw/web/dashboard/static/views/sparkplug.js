// Sparkplug: groups, edge nodes and devices with the state the gateway
// keeps of them (GET /api/sparkplug: online, bdSeq, last seq, gaps), and
// their metrics decoded here from what the page receives over MQTT: the
// births the gateway keeps on $sparkplug/certificates/ (retained, so
// names and first values are there at once) and the births and data
// that pass.  Data metrics named by alias only get their names from the
// latest birth.  The gateway lists, and sends, only what this user may
// read.  Nothing is subscribed or decoded before the view is first shown.
// A birth that comes twice (its certificate, then itself; the
// certificate again when the connection is made anew) is applied once,
// so data that came after it is not undone.

import { formatNumber } from "../chart.js";
import { PolledView, age, h } from "../dom.js";
import { DATATYPES, Malformed, decode, display, valueOf } from "../sparkplug.js";

const NAMESPACE = "spBv1.0/";
const CERTIFICATES = "$sparkplug/certificates/";
const DRAW_EVERY = 500;
// Bounds on what the page keeps, whatever arrives, and on what it draws.
const MAX_HOLDERS = 5000;
const MAX_METRICS = 1000;
const MAX_ROWS = 2000;

function same(a, b) {
  if (!a || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

// A node's or a device's metrics: name -> {value, datatype, timestamp},
// and its aliases from its latest birth.
class Metrics {
  constructor() {
    this.aliases = new Map();
    this.values = new Map();
    this.updated = null;
    this.born = null;
  }

  birth(payload) {
    this.aliases.clear();
    this.values.clear();
    this.data(payload, true);
  }

  data(payload, birth = false) {
    for (const metric of payload.metrics) {
      const alias = metric.alias === undefined ? undefined : String(metric.alias);
      let name = metric.name;
      if (birth && name !== undefined && alias !== undefined) this.aliases.set(alias, name);
      if (name === undefined) name = this.aliases.get(alias) ?? (alias === undefined ? "(no name)" : `alias ${alias}`);
      const known = this.values.get(name);
      if (!known && this.values.size >= MAX_METRICS) continue;
      const datatype = metric.datatype ?? (known ? known.datatype : 0);
      let value;
      try {
        value = valueOf(metric, datatype);
      } catch (e) {
        value = `unreadable: ${e.message}`;
      }
      this.values.set(name, { value, datatype, alias, timestamp: metric.timestamp ?? payload.timestamp });
    }
    this.updated = Date.now() / 1000;
  }
}

export class Sparkplug extends PolledView {
  constructor(app) {
    super(app, "Sparkplug", 3000);
    this.state = null;
    this.error = null;
    // "group/node" and "group/node/device" -> Metrics
    this.metrics = new Map();
    this.malformed = 0;
    this.started = false;
    this.visible = false;
    this.filter = "";
    this.body = h("div#sparkplug-edge");
    this.node = h("section.view", { "aria-labelledby": "sparkplug-title" },
      h("h2#sparkplug-title", { text: "Sparkplug" }),
      h("div.toolbar", {}, h("input#sparkplug-filter", {
        type: "search", placeholder: "filter: group, edge node or device", "aria-label": "Filter edge nodes and devices",
        autocomplete: "off", oninput: (event) => { this.filter = event.target.value.trim(); this.draw(); },
      })),
      this.body);
    app.mqtt.addEventListener("message", (event) => this.received(event.detail));
  }

  show() {
    if (!this.started) {
      this.started = true;
      this.app.mqtt.subscribe(CERTIFICATES + NAMESPACE + "#", 0);
      this.app.mqtt.subscribe(NAMESPACE + "#", 0);
    }
    this.visible = true;
    this.draw();
    super.show();
  }

  hide() {
    this.visible = false;
    super.hide();
  }

  async poll() {
    try {
      this.state = await this.app.session.api("sparkplug");
      this.error = null;
    } catch (e) {
      this.error = e.message;
    }
    this.draw();
  }

  received({ topic, payload }) {
    if (!this.started) return;
    const name = topic.startsWith(CERTIFICATES) ? topic.slice(CERTIFICATES.length) : topic;
    if (!name.startsWith(NAMESPACE)) return;
    const parts = name.split("/");
    if (parts.length !== 4 && parts.length !== 5) return;
    const [, group, kind, edgeNode, device] = parts;
    const birth = kind === "NBIRTH" || kind === "DBIRTH";
    // Deaths and commands carry no metric values of the edge to show.
    if (!birth && kind !== "NDATA" && kind !== "DDATA") return;
    if ((parts.length === 5) !== kind.startsWith("D") || !group || !edgeNode || device === "") return;
    const key = parts.length === 5 ? `${group}/${edgeNode}/${device}` : `${group}/${edgeNode}`;
    let metrics = this.metrics.get(key);
    if (!metrics) {
      if (this.metrics.size >= MAX_HOLDERS) return;
      this.metrics.set(key, metrics = new Metrics());
    }
    if (birth && same(metrics.born, payload)) return;
    let decoded;
    try {
      decoded = decode(payload);
    } catch (e) {
      if (!(e instanceof Malformed)) throw e;
      this.malformed += 1;
      return;
    }
    if (birth) {
      metrics.born = payload;
      metrics.birth(decoded);
    } else {
      metrics.data(decoded);
    }
    this.later();
  }

  // Drawn at most every DRAW_EVERY ms, however fast data comes.
  later() {
    if (!this.visible || this.pending) return;
    const wait = Math.max(0, (this.drawn || 0) + DRAW_EVERY - performance.now());
    this.pending = setTimeout(() => { this.pending = null; this.draw(); }, wait);
  }

  // Groups -> nodes -> devices, from the gateway's list and what arrived.
  tree() {
    const groups = new Map();
    const nodeOf = (group, edgeNode) => {
      if (!groups.has(group)) groups.set(group, new Map());
      const nodes = groups.get(group);
      if (!nodes.has(edgeNode)) nodes.set(edgeNode, { state: null, devices: new Map() });
      return nodes.get(edgeNode);
    };
    for (const state of (this.state && this.state.edge_nodes) || []) {
      const entry = nodeOf(state.group, state.edge_node);
      entry.state = state;
      for (const d of state.devices) entry.devices.set(d.device, d);
    }
    for (const key of this.metrics.keys()) {
      const [group, edgeNode, device] = key.split("/");
      const entry = nodeOf(group, edgeNode);
      if (device !== undefined && !entry.devices.has(device)) entry.devices.set(device, null);
    }
    return groups;
  }

  draw() {
    if (!this.visible) return;
    this.drawn = performance.now();
    const s = this.state;
    const notes = [];
    if (s && s.stats) {
      notes.push(h("p.muted#sparkplug-summary", {
        text: `${formatNumber(s.stats.nodes_online)} edge nodes and ${formatNumber(s.stats.devices_online)} devices online at the gateway;`
          + ` ${formatNumber(s.stats.out_of_sequence)} messages out of sequence.`,
      }));
    }
    if (this.error) notes.push(h("p.error", { text: this.error }));
    else if (s && !s.aware) notes.push(h("p.muted", { text: "Sparkplug awareness is off (sparkplug.aware): no state, only the metrics that arrive while the page is open." }));
    if (s && s.truncated) notes.push(h("p.muted", { text: "Not every edge node is listed: too many to list at once." }));
    if (this.malformed) notes.push(h("p.muted", { text: `${this.malformed} payloads were not Sparkplug B.` }));
    // Rows left to draw: past them, the filter narrows what is shown.
    this.left = MAX_ROWS;
    const sections = [];
    for (const [group, nodes] of sorted(this.tree())) {
      const drawn = [];
      for (const [edgeNode, entry] of sorted(nodes)) {
        if (this.left <= 0) break;
        const node = this.drawNode(group, edgeNode, entry);
        if (node) drawn.push(node);
      }
      if (drawn.length) sections.push(h("section.sp-group", { "data-group": group }, h("h3", { text: `Group ${group}` }), drawn));
    }
    if (this.left <= 0) notes.push(h("p.muted", { text: `The first ${MAX_ROWS} rows are shown: filter to see the others.` }));
    if (!sections.length) {
      sections.push(h("p.muted", { text: this.filter ? "Nothing matches the filter." : "No Sparkplug edge nodes seen yet (topics spBv1.0/…)." }));
    }
    this.body.replaceChildren(...notes, ...sections);
  }

  drawNode(group, edgeNode, entry) {
    const key = `${group}/${edgeNode}`;
    const all = !this.filter || key.includes(this.filter);
    const devices = sorted(entry.devices).filter(([device]) => all || `${key}/${device}`.includes(this.filter));
    if (!all && !devices.length) return null;
    const state = entry.state;
    const now = Date.now() / 1000;
    const facts = state
      ? [
        badge(state.online),
        fact("bdSeq", state.bdSeq, "bdseq"),
        fact("last seq", state.seq, "seq"),
        fact("out of sequence", state.out_of_sequence, "out-of-sequence"),
        fact(state.online ? "born" : "offline", state.since == null ? null : `${age(now - state.since)} ago`, "since"),
      ]
      : [h("span.muted", { text: "no state from the gateway" })];
    const parts = [h("h4", {}, h("span", { text: `Edge node ${edgeNode}` }), ...facts), this.drawMetrics(key)];
    for (const [device, d] of devices) {
      if (this.left <= 0) break;
      parts.push(h("div.sp-device", { "data-device": `${key}/${device}`, "data-state": d ? (d.online ? "online" : "offline") : "unknown" },
        h("h5", {}, h("span", { text: `Device ${device}` }), d ? badge(d.online) : null),
        this.drawMetrics(`${key}/${device}`),
      ));
    }
    return h("article.panel.sp-node", { "data-node": key, "data-state": state ? (state.online ? "online" : "offline") : "unknown" }, parts);
  }

  drawMetrics(key) {
    this.left -= 1;
    const metrics = this.metrics.get(key);
    if (!metrics || !metrics.values.size) return h("p.muted", { text: "No metrics received." });
    const now = Date.now() / 1000;
    const shown = sorted(metrics.values).slice(0, Math.max(this.left, 1));
    this.left -= shown.length;
    const rows = shown.map(([name, m]) => h("tr", { "data-metric": name },
      h("th", { scope: "row", text: name }),
      h("td.value", { text: display(m.value, m.datatype) }),
      h("td.muted", { text: DATATYPES[m.datatype] || String(m.datatype) }),
      h("td.muted", { text: m.alias === undefined ? "" : `alias ${m.alias}` }),
    ));
    return h("div.scroll", {}, h("table.sp-metrics", {},
      h("caption", { text: `updated ${age(now - metrics.updated)} ago` }),
      h("thead", {}, h("tr", {}, ["Metric", "Value", "Type", "Alias"].map((text) => h("th", { scope: "col", text })))),
      h("tbody", {}, rows),
    ));
  }
}

// A Map's entries in the order of their keys.
function sorted(map) {
  return [...map].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

function badge(online) {
  return h(`span.badge.${online ? "up" : "down"}`, { text: online ? "online" : "offline" });
}

function fact(label, value, id) {
  return h("span.fact", { "data-fact": id }, `${label} `, h("strong", { text: value == null ? "–" : String(value) }));
}
