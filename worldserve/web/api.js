// HTTP helpers shared by the tabs: JSON requests that throw PlaygroundError, the curl
// rendering of a request, WebSocket URLs, and which surfaces this server offers.

import { PlaygroundError, fromResponse } from "./errors.js";

/** fetch() that turns network failures and non-2xx answers into PlaygroundError. */
export async function request(surface, method, path, body = undefined) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (exc) {
    throw new PlaygroundError(surface, { code: "network", message: String(exc.message || exc) });
  }
  if (!response.ok) throw await fromResponse(surface, response);
  return response;
}

export async function requestJson(surface, method, path, body = undefined) {
  const response = await request(surface, method, path, body);
  return response.json();
}

function shellQuote(text) {
  return `'${String(text).replaceAll("'", `'\\''`)}'`;
}

/** The same request as a copyable curl command against this server. */
export function curlCommand(method, path, body = undefined) {
  const url = new URL(path, window.location.origin).href;
  const lines = [`curl -sS -X ${method} ${shellQuote(url)}`];
  if (body !== undefined) {
    lines.push(`  -H 'Content-Type: application/json'`);
    lines.push(`  -d ${shellQuote(JSON.stringify(body))}`);
  }
  return lines.join(" \\\n");
}

/** ws:// or wss:// URL of a path on this server. */
export function wsUrl(path) {
  const url = new URL(path, window.location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

/** {images, videos, streaming, realtime} -> bool, from GET /web/surfaces (all true if unknown). */
export async function offeredSurfaces() {
  try {
    const response = await fetch("/web/surfaces");
    if (response.ok) return await response.json();
  } catch {
    // An older server without the discovery route: let each tab find out on first use.
  }
  return { images: true, videos: true, streaming: true, realtime: true };
}

/** Copy text to the clipboard; falls back to selecting the element's text. */
export async function copyText(text, element) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const range = document.createRange();
    range.selectNodeContents(element);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    return false;
  }
}

/** Turn a 404 of a route into the "this server does not offer X" error. */
export function routeMissing(surface) {
  return new PlaygroundError(surface, { code: "route_missing", status: 404, message: "route not found on this server" });
}
