// The dashboard: sign in, one MQTT connection over WebSocket to the
// gateway that served the page, and the views.

import { h, notice } from "./dom.js";
import { MQTTClient } from "./mqtt.js";
import { Session } from "./session.js";
import { Analytics } from "./views/analytics.js";
import { Clients } from "./views/clients.js";
import { Overview } from "./views/overview.js";
import { Sparkplug } from "./views/sparkplug.js";
import { Topics } from "./views/topics.js";

class App {
  constructor() {
    this.session = new Session();
    this.main = document.getElementById("main");
    this.nav = document.getElementById("nav");
    this.state = document.getElementById("connection");
  }

  async open() {
    try {
      await this.session.discover();
    } catch (e) {
      notice(`The gateway does not answer: ${e.message}`, "error");
      return;
    }
    if (this.session.signin) this.askToSignIn();
    else this.start();
  }

  askToSignIn(why) {
    this.nav.replaceChildren();
    const user = h("input#signin-user", { name: "username", autocomplete: "username", required: true });
    const password = h("input#signin-password", { name: "password", type: "password", autocomplete: "current-password", required: true });
    const error = h("p.error#signin-error", { role: "alert", text: why || "" });
    const form = h("form.signin#signin", {
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = "";
        try {
          await this.session.signIn(user.value, password.value);
        } catch (e) {
          error.textContent = e.message;
          return;
        }
        this.start();
      },
    },
    h("h2", { text: "Sign in" }),
    h("label", { for: "signin-user", text: "User name" }), user,
    h("label", { for: "signin-password", text: "Password" }), password,
    h("button", { type: "submit", text: "Sign in" }),
    error);
    this.main.replaceChildren(form);
    user.focus();
  }

  start() {
    const url = new URL("mqtt", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    this.mqtt = new MQTTClient(url.href, { credentials: () => this.session.credentials() });
    this.mqtt.addEventListener("connect", () => this.connection("connected", "up"));
    this.mqtt.addEventListener("close", (event) => this.connection(`disconnected: ${event.detail}`, "down"));
    this.session.addEventListener("token", () => this.mqtt.restart());
    this.session.addEventListener("expired", (event) => {
      this.mqtt.stop();
      this.askToSignIn(`Signed out: ${event.detail}`);
    });
    this.views = {
      overview: new Overview(this), topics: new Topics(this), sparkplug: new Sparkplug(this), analytics: new Analytics(this),
    };
    if (this.session.role === "admin") this.views.clients = new Clients(this);
    this.mqtt.start();
    this.nav.replaceChildren(
      ...Object.entries(this.views).map(([name, view]) => h("a", { href: `#${name}`, "data-view": name, text: view.title })),
      h("span.who", { text: this.session.user ? `${this.session.user} (${this.session.role === "admin" ? "admin" : "read-only"})` : this.session.role === "admin" ? "admin" : "read-only" }),
    );
    window.addEventListener("hashchange", () => this.route());
    this.route();
  }

  connection(text, kind) {
    this.state.textContent = text;
    this.state.dataset.state = kind;
  }

  route() {
    const name = location.hash.slice(1);
    const view = this.views[name] || this.views.overview;
    if (this.current === view) return;
    if (this.current) this.current.hide();
    this.current = view;
    for (const link of this.nav.querySelectorAll("a")) {
      if (link.dataset.view === name || (!this.views[name] && link.dataset.view === "overview")) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    this.main.replaceChildren(view.node);
    document.title = `${view.title} · mqttgw`;
    view.show();
  }
}

const app = new App();
// For the console (and the tests): the page's state.
window.mqttgw = app;
app.open();
