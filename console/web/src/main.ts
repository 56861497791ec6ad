// The console: hash routes #/ (runs), #/runs/<id> (a run), #/start (the
// form that starts one), #/delegates (the delegates and presets). Each page owns its element, its calls and its
// timers, and gives them up in dispose when the route changes.

import { getToken, setToken, setUnauthenticatedHandler } from "./api";
import { delegatesPage } from "./delegates";
import { h } from "./dom";
import { runPage } from "./run";
import { runsPage } from "./runs";
import { startPage } from "./start";

export interface Page {
  el: HTMLElement;
  title: string;
  dispose(): void;
}

const main = document.getElementById("main") as HTMLElement;
let current: Page | undefined;

function notFound(path: string): Page {
  return {
    el: h("section", null, h("h1", null, "Not found"), h("p", null, "No page at ", h("code", null, path), ". ", h("a", { href: "#/" }, "See the runs."))),
    title: "Not found",
    dispose() {},
  };
}

function route(): void {
  current?.dispose();
  const hash = location.hash.replace(/^#/, "") || "/";
  const q = hash.indexOf("?");
  const path = q < 0 ? hash : hash.slice(0, q);
  const params = new URLSearchParams(q < 0 ? "" : hash.slice(q + 1));
  let m: RegExpExecArray | null;
  let nav = "";
  if (path === "/" || path === "/runs") {
    current = runsPage(params);
    nav = "runs";
  } else if ((m = /^\/runs\/([^/]+)$/.exec(path))) {
    current = runPage(decodeURIComponent(m[1]));
  } else if (path === "/start") {
    current = startPage(params);
    nav = "start";
  } else if (path === "/delegates") {
    current = delegatesPage();
    nav = "delegates";
  } else {
    current = notFound(path);
  }
  main.replaceChildren(current.el);
  document.title = current.title + " · Stubborn";
  for (const a of document.querySelectorAll<HTMLAnchorElement>("nav a[data-nav]")) {
    if (a.dataset.nav === nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

// The token prompt: shown when a call answers UNAUTHENTICATED (the server
// has tenants), or from the header's Token button. The token is kept in
// sessionStorage, for this tab only, and sent as Authorization: Bearer.
let dialog: HTMLDialogElement | undefined;
const tokenButton = document.getElementById("token-button") as HTMLButtonElement;

function promptToken(why: string): void {
  if (dialog?.open) return;
  dialog?.remove();
  const input = h("input", {
    type: "password", name: "token", id: "token-input", "data-testid": "token",
    autocomplete: "off", spellcheck: "false", required: true,
  });
  const form = h("form", { method: "dialog" },
    h("h2", { id: "token-title" }, "Bearer token"),
    why ? h("p", { class: "error" }, why) : null,
    h("p", null, "This server serves tenants: give a tenant's token. It is kept in this tab only (sessionStorage) and sent as ",
      h("code", null, "Authorization: Bearer …"), "."),
    h("label", { for: "token-input" }, "Token"),
    input,
    h("div", { class: "buttons" },
      h("button", { type: "submit", "data-testid": "token-save" }, "Save"),
      getToken() ? h("button", { type: "button", class: "secondary", onclick: () => save("") }, "Forget token") : null,
      h("button", { type: "button", class: "secondary", onclick: () => dialog?.close() }, "Cancel")),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    save(input.value.trim());
  });
  dialog = h("dialog", { class: "token", "aria-labelledby": "token-title" }, form);
  document.body.append(dialog);
  dialog.showModal();
  input.focus();
}

function save(token: string): void {
  setToken(token);
  tokenButton.hidden = !token;
  dialog?.close();
  route();
}

setUnauthenticatedHandler((message) => promptToken(message));
tokenButton.hidden = !getToken();
tokenButton.addEventListener("click", () => promptToken(""));

window.addEventListener("hashchange", route);
route();
