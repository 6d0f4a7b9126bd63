// Who the page is signed in as, the token it holds for the admin API and
// its MQTT connection, and the renewal of that token while the page is
// open.  The token lives in memory only: a reload signs in again.

export class Session extends EventTarget {
  constructor() {
    super();
    this.user = null;
    this.role = null;
    this.token = null;
    this.signin = true;
  }

  // Whether the gateway asks for credentials; on an open (loopback) admin
  // listener with no credentials at all, the page is an admin at once.
  async discover() {
    const answer = await fetch("api/whoami", { cache: "no-store" }).then((r) => r.json());
    this.signin = answer.signin;
    if (!answer.signin) this.role = answer.open ? "admin" : "read";
    return answer;
  }

  async signIn(username, password) {
    const basic = btoa(String.fromCharCode(...new TextEncoder().encode(`${username}:${password}`)));
    await this._token({ Authorization: `Basic ${basic}` });
  }

  async _token(headers) {
    const response = await fetch("api/token", {
      method: "POST", headers: { ...headers, "X-Requested-With": "mqttgw" }, cache: "no-store",
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) {
      const why = { 401: "user name or password refused", 403: "this user may not use the dashboard" };
      throw new Error(answer.error || why[response.status] || `sign-in failed (${response.status})`);
    }
    this.user = answer.user;
    this.role = answer.role;
    this.token = answer.token;
    clearTimeout(this.renewal);
    // Renewed at two thirds of its life, so a slow answer is still in time.
    this.renewal = setTimeout(() => this.renew(), answer.lifetime * 667);
    this.dispatchEvent(new Event("token"));
  }

  async renew() {
    try {
      await this._token({ Authorization: `Bearer ${this.token}` });
    } catch (e) {
      this.dispatchEvent(new CustomEvent("expired", { detail: e.message }));
    }
  }

  signOut() {
    clearTimeout(this.renewal);
    this.user = this.role = this.token = null;
  }

  // The MQTT connection's user name and password: the token.
  credentials() {
    return this.token ? { username: this.user, password: this.token } : null;
  }

  // The admin API: JSON in and out, with the token.
  async api(path, { method = "GET" } = {}) {
    const headers = { "X-Requested-With": "mqttgw" };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    const response = await fetch(`api/${path}`, { method, headers, cache: "no-store" });
    const answer = await response.json().catch(() => null);
    if (!response.ok) throw new Error((answer && answer.error) || `${method} ${path}: ${response.status}`);
    return answer;
  }
}
