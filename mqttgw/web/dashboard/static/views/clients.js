// Clients (admins): who is connected, sortable by any column, with a
// button that disconnects a client.

import { formatNumber } from "../chart.js";
import { PolledView, age, h, notice } from "../dom.js";
const COLUMNS = [
  ["client_id", "Client"], ["username", "User"], ["address", "Address"], ["listener", "Listener"],
  ["protocol", "MQTT"], ["subscriptions", "Subscriptions"], ["queued", "Queued"],
  ["inflight", "In flight"], ["dropped", "Dropped"], ["connected_since", "Connected"],
];

export class Clients extends PolledView {
  constructor(app) {
    super(app, "Clients");
    this.sort = ["client_id", 1];
    this.clients = [];
    this.node = h("section.view", { "aria-labelledby": "clients-title" });
  }

  async poll() {
    try {
      this.clients = await this.app.session.api("clients");
      this.error = null;
    } catch (e) {
      this.error = e.message;
    }
    this.draw();
  }

  async kick(clientId) {
    try {
      await this.app.session.api(`clients/${encodeURIComponent(clientId)}`, { method: "DELETE" });
      notice(`Client ${clientId} disconnected.`);
    } catch (e) {
      notice(e.message, "error");
    }
    this.poll();
  }

  draw() {
    const [key, direction] = this.sort;
    const rows = [...this.clients].sort((a, b) => {
      const x = a[key] ?? "", y = b[key] ?? "";
      return (x < y ? -1 : x > y ? 1 : 0) * direction;
    });
    const now = Date.now() / 1000;
    const heading = (name, label) => h("th", {
      scope: "col", "aria-sort": key === name ? (direction > 0 ? "ascending" : "descending") : "none",
    }, h("button.sort", {
      text: label + (key === name ? (direction > 0 ? " ▴" : " ▾") : ""),
      onclick: () => { this.sort = [name, key === name ? -direction : 1]; this.draw(); },
    }));
    const text = (c, name) => {
      const value = c[name];
      if (name === "connected_since") return value ? age(now - value) : "–";
      if (typeof value === "number") return formatNumber(value);
      return value == null ? "–" : String(value);
    };
    this.node.replaceChildren(
      h("h2#clients-title", { text: "Clients" }),
      this.error ? h("p.error", { text: this.error }) : h("p.muted", { text: `${rows.length} connected` }),
      h("div.scroll", {}, h("table#clients-table", {},
        // The action first: on a phone the columns scroll off to the right.
        h("thead", {}, h("tr", {}, h("td"), COLUMNS.map(([name, label]) => heading(name, label)))),
        h("tbody", {}, rows.map((c) => h("tr", { "data-client": c.client_id },
          h("td", {}, h("button.danger.kick", {
            text: "Kick", "aria-label": `Disconnect ${c.client_id}`, onclick: () => this.kick(c.client_id),
          })),
          COLUMNS.map(([name], i) => h(i ? "td" : "th", { scope: i ? null : "row", text: text(c, name) })),
        ))),
      )),
    );
  }
}
