// Every error the page shows goes through `explain()`: one table from server codes and
// messages to plain words. The server's own message is always kept (as `detail`), never dropped.

export const SURFACE_NAMES = {
  images: "image generation",
  videos: "video generation",
  streaming: "live video reasoning",
  realtime: "realtime world exploration",
};

/** An error with everything the page knows: HTTP status or close code, machine code, text. */
export class PlaygroundError extends Error {
  constructor(surface, { status = null, code = null, message = "", closeCode = null, retryAfterS = null } = {}) {
    super(message || "unknown error");
    this.surface = surface;
    this.status = status;
    this.code = code;
    this.closeCode = closeCode;
    this.retryAfterS = retryAfterS;
  }
}

const has = (text, ...needles) => needles.some((n) => text.includes(n));

// Ordered rules: the first that matches names the problem. `e` is a PlaygroundError.
const RULES = [
  {
    when: (e) => e.code === "route_missing" || (e.status === 404 && has(e.message, "no route", "Not Found")),
    say: (e) => `This server does not offer ${SURFACE_NAMES[e.surface] || e.surface}.`,
  },
  {
    when: (e) => e.code === "network",
    say: () => "Could not reach the server. Is it still running?",
  },
  {
    when: (e) => e.code === "connect_failed",
    say: (e) => `Could not open the ${SURFACE_NAMES[e.surface] || e.surface} connection: the server refused it or is not running.`,
  },
  {
    when: (e) => e.code === "admission_rejected" || e.code === "capacity_exceeded" ||
      (e.status === 503 && has(e.message, "exhausted", "capacity", "CAPACITY")),
    say: (e) => `Capacity reached: the server is already running as many sessions or jobs as it allows.${e.retryAfterS ? ` Try again in ${Math.ceil(e.retryAfterS)} s` : " Try again in a moment"}, or close another session.`,
  },
  {
    when: (e) => e.code === "stage_unavailable" || e.status === 503,
    say: (e) => `The part of the server that does ${SURFACE_NAMES[e.surface] || e.surface} is unavailable (stage not running or still loading).`,
  },
  {
    when: (e) => e.status === 413 || e.code === "payload_too_large",
    say: () => "Frame too large: lower the resolution or the JPEG quality, then try again.",
  },
  {
    when: (e) => e.status === 409 && has(e.message, "busy"),
    say: () => "The session is still working on the previous frame; frames must be sent one at a time.",
  },
  {
    when: (e) => e.status === 409,
    say: () => "The session is no longer usable; start a new one.",
  },
  {
    when: (e) => e.status === 408 || has(e.message, "idle timeout"),
    say: () => "The session timed out after a period without activity; start a new one.",
  },
  {
    when: (e) => e.status === 504 || e.code === "timeout",
    say: () => "The server took too long to answer and closed the session; start a new one.",
  },
  {
    when: (e) => e.code === "unsupported_pipeline" || e.status === 501,
    say: (e) => `The loaded model cannot do ${SURFACE_NAMES[e.surface] || e.surface}.`,
  },
  {
    when: (e) => e.code === "invalid_init" || e.code === "invalid_event" || e.status === 400 || e.status === 422,
    say: () => "The server refused the request: check the settings.",
  },
  {
    when: (e) => e.code === "generation_error" || e.code === "generation_failed" || e.status >= 500,
    say: () => "The server failed while generating; see the detail below and the server log.",
  },
  {
    when: (e) => e.status === 404,
    say: () => "Not found: it may have been deleted or expired.",
  },
];

/** `{title, detail}` in plain words for any error (PlaygroundError or anything thrown). */
export function explain(error) {
  if (!(error instanceof PlaygroundError)) {
    return { title: "Something went wrong in the page.", detail: String(error && error.message || error) };
  }
  const rule = RULES.find((r) => r.when(error));
  const title = rule ? rule.say(error) : "The server reported an error.";
  const parts = [];
  if (error.status !== null) parts.push(`status ${error.status}`);
  if (error.closeCode !== null) parts.push(`close code ${error.closeCode}`);
  if (error.code !== null && error.code !== error.status) parts.push(`code ${error.code}`);
  const detail = `${error.message}${parts.length ? ` (${parts.join(", ")})` : ""}`;
  return { title, detail };
}

/** Build a PlaygroundError from a failed HTTP response (OpenAI/SGLang or NIM error envelope). */
export async function fromResponse(surface, response) {
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  const err = body && typeof body.error === "object" && body.error ? body.error : {};
  const message = err.message || (typeof body?.detail === "string" ? body.detail : "") ||
    (typeof body?.error === "string" ? body.error : "") || response.statusText || "request failed";
  const code = typeof err.code === "string" ? err.code : null;
  return new PlaygroundError(surface, { status: response.status, code, message });
}

/** Show an error in a `.error` element (title and detail), or clear it with `null`. */
export function showError(element, error) {
  element.replaceChildren();
  element.hidden = error === null;
  if (error === null) return;
  const { title, detail } = explain(error);
  const strong = document.createElement("strong");
  strong.textContent = title;
  const small = document.createElement("div");
  small.className = "detail";
  small.textContent = detail;
  element.append(strong, small);
  console.warn(`[${error.surface || "page"}] ${title} — ${detail}`);
}
