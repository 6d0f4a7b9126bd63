// Overview: listeners, clients, message rates over the last 15 minutes,
// the store and every bridge, from the admin API every few seconds.

import { formatNumber, legend, lineChart } from "../chart.js";
import { PolledView, age, h } from "../dom.js";

export class Overview extends PolledView {
  constructor(app) {
    super(app, "Overview");
    this.node = h("section.view", { "aria-labelledby": "overview-title" });
    this.lastBridges = new Map();
  }

  async poll() {
    try {
      this.render(await this.app.session.api("overview"));
    } catch (e) {
      this.node.replaceChildren(h("h2#overview-title", { text: "Overview" }), h("p.error", { text: e.message }));
    }
  }

  drainRates(bridges, now) {
    // Messages sent upstream per second since the last poll.
    const rates = new Map();
    for (const bridge of bridges) {
      const last = this.lastBridges.get(bridge.name);
      if (last && now > last.at) rates.set(bridge.name, (bridge.sent - last.sent) / (now - last.at));
      this.lastBridges.set(bridge.name, { sent: bridge.sent, at: now });
    }
    return rates;
  }

  render(o) {
    const stats = o.stats;
    const rates = this.drainRates(o.bridges, o.time);
    const series = [
      { label: "in (msg/s)", points: o.rates.map(([t, i]) => [t, i]) },
      { label: "out (msg/s)", points: o.rates.map(([t, , d]) => [t, d]) },
    ];
    const latest = o.rates[o.rates.length - 1] || [0, 0, 0];
    const card = (label, value, id) => h("div.card", { "data-metric": id }, h("span.label", { text: label }), h("strong", { text: value }));
    this.node.replaceChildren(
      h("h2#overview-title", { text: "Overview" }),
      h("div.cards", {},
        card("Status", o.ready ? "ready" : "not ready", "ready"),
        card("Clients", formatNumber(o.clients), "clients"),
        card("In", `${formatNumber(latest[1])}/s`, "in"),
        card("Out", `${formatNumber(latest[2])}/s`, "out"),
        card("Subscriptions", formatNumber(o.subscriptions), "subscriptions"),
        card("Retained", formatNumber(o.retained), "retained"),
        card("Store", o.store ? `${o.store.state}, commit ${o.store.commit_seconds == null ? "–" : (o.store.commit_seconds * 1000).toFixed(1) + " ms"}` : "in memory", "store"),
        card("Up", age(o.uptime), "uptime"),
      ),
      h("figure.panel",
        {},
        h("figcaption", { text: "Messages per second, last 15 minutes" }),
        lineChart(series, { title: "messages in and out per second" }),
        legend(series),
      ),
      h("h3", { text: "Bridges" }),
      o.bridges.length
        ? table(["Bridge", "State", "Upstream", "Queued", "Bytes", "Oldest", "In flight", "Drain", "Sent", "Dropped", "Link changes"],
          o.bridges.map((b) => h("tr", { "data-bridge": b.name, "data-state": b.connected ? "up" : "down" },
            h("th", { scope: "row", text: b.name }),
            h("td", {}, h(`span.badge.${b.connected ? "up" : "down"}`, { text: b.connected ? "up" : "down" })),
            h("td", { text: b.addresses.join(", ") }),
            h("td.num", { text: formatNumber(b.queued) }),
            h("td.num", { "data-metric": "queued-bytes", text: formatNumber(b.queued_bytes ?? 0) }),
            h("td.num", { "data-metric": "oldest", text: b.oldest_queued_s == null ? "–" : age(b.oldest_queued_s) }),
            h("td.num", { text: formatNumber(b.inflight) }),
            h("td.num", { text: b.drain_rate != null ? `${formatNumber(b.drain_rate)}/s` : rates.has(b.name) ? `${formatNumber(rates.get(b.name))}/s` : "–" }),
            h("td.num", { text: formatNumber(b.sent) }),
            h("td.num", { text: formatNumber(b.dropped) }),
            h("td.num", { "data-metric": "link-changes", text: formatNumber(b.link_changes ?? 0) }),
          )))
        : h("p.muted", { text: "No bridges." }),
      h("h3", { text: "Listeners" }),
      table(["Kind", "Address", "State", "TLS", "Anonymous"],
        o.listeners.map((l) => h("tr", {},
          h("th", { scope: "row", text: l.kind }),
          h("td", { text: l.address }),
          h("td", {}, h(`span.badge.${l.listening ? "up" : "down"}`, { text: l.listening ? "listening" : "not bound" })),
          h("td", { text: l.tls ? "yes" : "no" }),
          h("td", { text: l.anonymous ? "allowed" : "no" }),
        ))),
      h("p.muted", { text: `Received ${formatNumber(stats.messages_received)}, delivered ${formatNumber(stats.messages_delivered)}, dropped ${formatNumber(stats.messages_dropped)}, denied ${formatNumber(stats.messages_denied)}.` }),
    );
  }
}

export function table(headings, rows) {
  return h("div.scroll", {},
    h("table", {},
      h("thead", {}, h("tr", {}, headings.map((text) => h("th", { scope: "col", text })))),
      h("tbody", {}, rows),
    ));
}
