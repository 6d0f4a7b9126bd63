// A small MQTT 3.1.1 client over WebSocket: what the dashboard needs and
// no more.  CONNECT, SUBSCRIBE and PUBLISH at QoS 0 and 1, PINGREQ on the
// keepalive, and a reconnect with a growing delay while it is wanted.
// Events: "connect", "close" (detail: reason), "message" (detail:
// {topic, payload (Uint8Array), retain, qos}).

const CONNECT = 1, CONNACK = 2, PUBLISH = 3, PUBACK = 4, PUBREC = 5, PUBREL = 6,
  PUBCOMP = 7, SUBSCRIBE = 8, SUBACK = 9, PINGREQ = 12, PINGRESP = 13, DISCONNECT = 14;

const CONNACK_REASONS = {
  1: "unacceptable protocol version", 2: "client id refused", 3: "server unavailable",
  4: "bad user name or password", 5: "not authorized",
};

const encoder = new TextEncoder();

function utf8(text) {
  const bytes = encoder.encode(text);
  return [bytes.length >> 8, bytes.length & 255, ...bytes];
}

function packet(type, flags, body) {
  const length = [];
  let n = body.length;
  do {
    let digit = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) digit |= 128;
    length.push(digit);
  } while (n > 0);
  const out = new Uint8Array(1 + length.length + body.length);
  out[0] = (type << 4) | flags;
  out.set(length, 1);
  out.set(body, 1 + length.length);
  return out;
}

export class MQTTClient extends EventTarget {
  // url: ws(s)://...; credentials(): {username, password} or null, asked at
  // each (re)connect so a renewed token is used.
  constructor(url, { clientId, credentials = () => null, keepalive = 30 } = {}) {
    super();
    this.url = url;
    this.clientId = clientId || "mqttgw-dash-" + Math.random().toString(36).slice(2, 10);
    this.credentials = credentials;
    this.keepalive = keepalive;
    this.connected = false;
    this.subscriptions = new Map();
    this.nextId = 1;
    this.pending = new Map();
    this.wanted = false;
    this.delay = 1000;
  }

  start() {
    this.wanted = true;
    this._open();
  }

  stop() {
    this.wanted = false;
    clearTimeout(this.retry);
    if (this.socket) {
      if (this.connected) this.socket.send(packet(DISCONNECT, 0, []));
      this.socket.close();
    }
  }

  // Closes the connection and opens a new one at once (a renewed token).
  restart() {
    this.delay = 0;
    if (this.socket) this.socket.close();
    else this._open();
  }

  subscribe(filter, qos = 0) {
    this.subscriptions.set(filter, qos);
    if (this.connected) this._subscribe([[filter, qos]]);
  }

  // Resolves once sent (QoS 0) or acknowledged (QoS 1).
  publish(topic, payload, { qos = 0, retain = false } = {}) {
    if (!this.connected) return Promise.reject(new Error("not connected"));
    const data = typeof payload === "string" ? encoder.encode(payload) : payload;
    const body = [...utf8(topic)];
    let id = 0;
    if (qos > 0) {
      id = this._id();
      body.push(id >> 8, id & 255);
    }
    body.push(...data);
    this.socket.send(packet(PUBLISH, (qos << 1) | (retain ? 1 : 0), body));
    if (qos === 0) return Promise.resolve();
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject }));
  }

  _id() {
    const id = this.nextId;
    this.nextId = id === 65535 ? 1 : id + 1;
    return id;
  }

  _open() {
    clearTimeout(this.retry);
    // The first subprotocol tells the gateway this is its dashboard, which
    // it sends a bounded rate of messages; "mqtt" for any other server.
    const socket = new WebSocket(this.url, ["mqttgw-dashboard", "mqtt"]);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    this.buffer = new Uint8Array(0);
    socket.onopen = () => {
      const creds = this.credentials();
      let flags = 0x02;
      const body = [...utf8("MQTT"), 4, 0, this.keepalive >> 8, this.keepalive & 255, ...utf8(this.clientId)];
      if (creds && creds.username != null) {
        flags |= 0x80;
        body.push(...utf8(creds.username));
        if (creds.password != null) {
          flags |= 0x40;
          body.push(...utf8(creds.password));
        }
      }
      body[7] = flags;
      socket.send(packet(CONNECT, 0, body));
    };
    socket.onmessage = (event) => this._received(new Uint8Array(event.data));
    socket.onclose = (event) => this._closed(this.reason || `closed (${event.code})`);
    socket.onerror = () => { this.reason = this.reason || "cannot reach the gateway"; };
  }

  _closed(reason) {
    const was = this.connected;
    this.connected = false;
    this.socket = null;
    this.reason = null;
    clearInterval(this.pinger);
    for (const { reject } of this.pending.values()) reject(new Error(reason));
    this.pending.clear();
    this.dispatchEvent(new CustomEvent("close", { detail: reason }));
    if (!this.wanted) return;
    if (was && this.delay > 1000) this.delay = 1000;
    this.retry = setTimeout(() => this._open(), this.delay);
    this.delay = Math.min(Math.max(this.delay * 2, 1000), 30000);
  }

  _received(data) {
    const joined = new Uint8Array(this.buffer.length + data.length);
    joined.set(this.buffer);
    joined.set(data, this.buffer.length);
    let at = 0;
    while (at + 2 <= joined.length) {
      let length = 0, multiplier = 1, i = at + 1, complete = false;
      while (i < joined.length && i < at + 5) {
        const digit = joined[i++];
        length += (digit & 127) * multiplier;
        multiplier *= 128;
        if (!(digit & 128)) { complete = true; break; }
      }
      if (!complete || i + length > joined.length) break;
      this._packet(joined[at] >> 4, joined[at] & 15, joined.subarray(i, i + length));
      at = i + length;
    }
    this.buffer = joined.slice(at);
  }

  _packet(type, flags, body) {
    if (type === CONNACK) {
      if (body[1] !== 0) {
        this.reason = CONNACK_REASONS[body[1]] || `refused (${body[1]})`;
        // A refusal is not retried soon: the credentials need a change.
        this.delay = Math.max(this.delay, 10000);
        this.socket.close();
        return;
      }
      this.connected = true;
      this.delay = 1000;
      this.pinger = setInterval(() => this.socket.send(packet(PINGREQ, 0, [])), this.keepalive * 500);
      if (this.subscriptions.size) this._subscribe([...this.subscriptions]);
      this.dispatchEvent(new Event("connect"));
    } else if (type === PUBLISH) {
      const qos = (flags >> 1) & 3;
      const length = (body[0] << 8) | body[1];
      const topic = new TextDecoder().decode(body.subarray(2, 2 + length));
      let at = 2 + length;
      if (qos > 0) {
        const id = [body[at], body[at + 1]];
        at += 2;
        this.socket.send(packet(qos === 1 ? PUBACK : PUBREC, 0, id));
      }
      this.dispatchEvent(new CustomEvent("message", {
        detail: { topic, payload: body.slice(at), retain: (flags & 1) === 1, qos },
      }));
    } else if (type === PUBREL) {
      this.socket.send(packet(PUBCOMP, 0, [body[0], body[1]]));
    } else if (type === PUBACK) {
      const id = (body[0] << 8) | body[1];
      const waiting = this.pending.get(id);
      this.pending.delete(id);
      if (waiting) waiting.resolve();
    } else if (type === SUBACK || type === PINGRESP) {
      // Nothing waits for them.
    }
  }

  _subscribe(filters) {
    const id = this._id();
    const body = [id >> 8, id & 255];
    for (const [filter, qos] of filters) body.push(...utf8(filter), qos);
    this.socket.send(packet(SUBSCRIBE, 2, body));
  }
}
