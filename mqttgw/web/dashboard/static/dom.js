// h("tag.class#id", {attribute: value, onclick: f}, child...): an element.
export function h(spec, attributes = {}, ...children) {
  const [names, id] = spec.split("#");
  const [tag, ...classes] = names.split(".");
  const node = document.createElement(tag);
  if (classes.length) node.className = classes.join(" ");
  if (id) node.id = id;
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value == null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child != null && child !== false) node.append(child);
  }
  return node;
}

export function age(seconds) {
  if (seconds == null) return "–";
  if (seconds < 1) return "now";
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86400)} d`;
}

// A status line the page and its tests read: role="status" announces it.
export function notice(text, kind = "info") {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.dataset.kind = kind;
}

// A view drawn from the admin API: asked again every ``every`` ms while
// shown.  Subclasses give poll().
export class PolledView {
  constructor(app, title, every = 5000) {
    this.app = app;
    this.title = title;
    this.every = every;
  }

  show() {
    this.poll();
    this.timer = setInterval(() => this.poll(), this.every);
  }

  hide() {
    clearInterval(this.timer);
  }
}
