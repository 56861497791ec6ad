// The API: a Connect client of the ControlService on this page's origin,
// the bearer token of a tenant (kept in sessionStorage), and errors in words.

import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { text } from "./dom";
import { ControlService } from "../../../clients/typescript/src/gen/stubborn/v1/control_pb.js";

const tokenKey = "stubborn.token";

export function getToken(): string {
  try {
    return sessionStorage.getItem(tokenKey) ?? "";
  } catch {
    return "";
  }
}

export function setToken(token: string): void {
  try {
    if (token) sessionStorage.setItem(tokenKey, token);
    else sessionStorage.removeItem(tokenKey);
  } catch {
    // Storage refused (a private window's quota): the token lasts as long
    // as the page does not reload.
  }
  memoryToken = token;
}

let memoryToken = "";

// bearer sends the tenant's token, when one was given, on every call.
const bearer: Interceptor = (next) => async (req) => {
  const token = getToken() || memoryToken;
  if (token) req.header.set("Authorization", "Bearer " + token);
  return await next(req);
};

export const api: Client<typeof ControlService> = createClient(
  ControlService,
  createConnectTransport({
    baseUrl: window.location.origin,
    useBinaryFormat: true,
    interceptors: [bearer],
  }),
);

// unauthenticated is called when a call answers UNAUTHENTICATED (main.ts
// shows the token prompt).
let onUnauthenticated: (message: string) => void = () => {};

export function setUnauthenticatedHandler(f: (message: string) => void): void {
  onUnauthenticated = f;
}

// isAbort reports whether err is the end of a call this page cancelled.
export function isAbort(err: unknown): boolean {
  if (err instanceof ConnectError) return err.code === Code.Canceled;
  return err instanceof DOMException && err.name === "AbortError";
}

// codeName is a Connect code as the protocol spells it: "not_found".
function codeName(code: Code): string {
  return Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}

// describe says what went wrong in a call, for a person: the code and the
// server's message. An UNAUTHENTICATED answer also opens the token prompt.
export function describe(err: unknown): string {
  const e = ConnectError.from(err);
  if (e.code === Code.Unauthenticated) onUnauthenticated(e.rawMessage);
  if (e.code === Code.Unavailable && /fetch|network/i.test(e.rawMessage)) {
    return "unavailable: the server cannot be reached (" + e.rawMessage + ")";
  }
  return codeName(e.code) + ": " + e.rawMessage;
}

// report writes what went wrong in a call into el, after prefix; nothing
// for UNAUTHENTICATED, which the token prompt says (once, not once a
// page's call).
export function report(el: Element, prefix: string, err: unknown): void {
  const msg = describe(err);
  text(el, errorCode(err) === Code.Unauthenticated ? "" : prefix + msg);
}

export function errorCode(err: unknown): Code {
  return ConnectError.from(err).code;
}
