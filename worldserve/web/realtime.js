// Realtime world tab: WS /v1/realtime_video/generate with msgpack framing. Frames are drawn on
// a canvas at the session fps; held W A S D / I J K L keys are sent as camera state-mode
// events; the prompt box switches the prompt; chunk_stats feed the live numbers.

import { wsUrl } from "./api.js";
import { PlaygroundError, showError } from "./errors.js";
import { BatchDecoder } from "./frames.js";
import { optionalInt, text } from "./form.js";
import * as msgpack from "./msgpack.js";
import { MessageSocket } from "./socket.js";

const PATH = "/v1/realtime_video/generate";
const CAMERA_KEYS = "wasdijkl";
const DEFAULT_FPS = 16;
// Frames waiting to be drawn. Past this the oldest are dropped: with pacing on they arrive in
// real time, and a viewer steering the camera wants the newest frames, not a backlog.
const MAX_QUEUED_FRAMES = 48;
const MAX_PENDING_EVENTS = 64;
// Errors after which the session goes on (realtime-video.md §4.4). After `invalid_init` the
// server would wait for another init, but the page sends one per session: it ends there.
const NON_FATAL = new Set(["invalid_event"]);

/** Draws queued frames at a fixed rate and measures the rate actually shown. */
class Player {
  constructor(canvas) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.queue = [];
    this.fps = DEFAULT_FPS;
    this.shownAt = [];
    this.frameCount = 0;
    this.timer = null;
  }

  push(frames) {
    this.queue.push(...frames);
    while (this.queue.length > MAX_QUEUED_FRAMES) this.release(this.queue.shift());
  }

  release(frame) { frame.image.close?.(); }

  start(fps) {
    this.stop();
    this.fps = fps;
    this.timer = setInterval(() => this.tick(), 1000 / fps);
  }

  stop() {
    clearInterval(this.timer);
    this.timer = null;
    this.queue.splice(0).forEach((f) => this.release(f));
  }

  tick() {
    const frame = this.queue.shift();
    if (!frame) return;
    if (this.canvas.width !== frame.width || this.canvas.height !== frame.height) {
      this.canvas.width = frame.width;
      this.canvas.height = frame.height;
    }
    if (frame.image instanceof ImageData) this.ctx.putImageData(frame.image, 0, 0);
    else this.ctx.drawImage(frame.image, 0, 0);
    this.release(frame);
    this.frameCount += 1;
    const now = performance.now();
    this.shownAt.push(now);
    while (this.shownAt[0] < now - 2000) this.shownAt.shift();
  }

  shownFps() {
    if (this.shownAt.length < 2) return 0;
    return (this.shownAt.length - 1) / ((this.shownAt.at(-1) - this.shownAt[0]) / 1000);
  }
}

function serverError(message) {
  const detail = message.detail ? `: ${message.detail}` : "";
  return new PlaygroundError("realtime", { code: message.code || "error", message: `${message.content}${detail}`,
    retryAfterS: message.retry_after_s ?? null });
}

function typingInField(event) {
  const tag = event.target?.tagName;
  return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
}

export function mount(section) {
  const form = section.querySelector("#realtime-form");
  const el = (id) => section.querySelector(`#realtime-${id}`);
  const errorBox = form.querySelector(".error");
  const canvas = el("canvas");
  const player = new Player(canvas);
  const decoder = new BatchDecoder();
  const held = new Set();
  const pendingEvents = new Map(); // event_id -> performance.now() at send
  let active = false;
  let session = null; // {socket, nextEventId}

  const setStatus = (message) => { el("status").textContent = message; };
  function setRunning(running) {
    el("start").disabled = running;
    el("stop").disabled = !running;
    el("prompt").disabled = !running;
    section.dataset.state = running ? "running" : "stopped";
  }

  function sendEvent(kind, payload) {
    if (!session?.socket.isOpen) return;
    const eventId = session.nextEventId++;
    pendingEvents.set(eventId, performance.now());
    if (pendingEvents.size > MAX_PENDING_EVENTS) pendingEvents.delete(pendingEvents.keys().next().value);
    session.socket.send(msgpack.encode({ type: "event", kind, payload, event_id: eventId,
      client_sent_perf_ms: performance.now(), client_sent_epoch_ms: Date.now() }));
  }

  function sendKeys() {
    const actions = [...CAMERA_KEYS].filter((k) => held.has(k));
    el("keys").textContent = actions.length ? actions.join(" ").toUpperCase() : "none";
    sendEvent("camera_actions", { mode: "state", transitions: [{ actions, client_ts_ms: Date.now() }] });
  }

  function onKey(event, down) {
    const key = event.key.toLowerCase();
    if (!active || !session || typingInField(event) || !CAMERA_KEYS.includes(key) || key.length !== 1) return;
    event.preventDefault();
    if (event.repeat || held.has(key) === down) return;
    if (down) held.add(key);
    else held.delete(key);
    sendKeys();
  }

  function onHeader(header) {
    if (header.event_id != null && pendingEvents.has(header.event_id)) {
      el("control").textContent = `${Math.round(performance.now() - pendingEvents.get(header.event_id))} ms`;
      for (const id of pendingEvents.keys()) if (id <= header.event_id) pendingEvents.delete(id);
    }
  }

  function onStats(stats) {
    const perFrame = stats.num_frames ? Math.round(stats.ws_payload_bytes / stats.num_frames) : 0;
    el("chunk").textContent = `#${stats.chunk_index} · ${stats.chunk_total_ms} ms total, ${stats.scheduler_forward_ms} ms generating`;
    el("bytes").textContent = `${perFrame.toLocaleString()} B (${stats.content_type})`;
    el("fps").textContent = player.shownFps().toFixed(1);
    section.dataset.chunks = String(stats.chunk_index + 1);
  }

  async function readLoop(current) {
    let pendingHeader = null;
    for (;;) {
      const data = await current.socket.next();
      if (pendingHeader) {
        const header = pendingHeader;
        pendingHeader = null;
        player.push(await decoder.decode(header, new Uint8Array(data)));
        continue;
      }
      if (typeof data === "string") throw new PlaygroundError("realtime", { message: "the server sent a text message; expected msgpack" });
      const message = msgpack.decode(data);
      if (message.type === "frame_batch_header") { onHeader(message); pendingHeader = message; }
      else if (message.type === "frame_batch") { onHeader(message); player.push(await decoder.decode(message, message.payload)); }
      else if (message.type === "chunk_stats") onStats(message);
      else if (message.type === "error") {
        const error = serverError(message);
        showError(errorBox, error);
        if (!NON_FATAL.has(message.code)) throw error;
      }
    }
  }

  async function start() {
    showError(errorBox, null);
    setRunning(true);
    decoder.reset();
    held.clear();
    const fps = DEFAULT_FPS;
    const init = {
      type: "init", prompt: text(form, "prompt"), seed: optionalInt(form, "seed") ?? 42,
      realtime_output_format: form.elements.encoding.value, realtime_output_pacing: true, fps,
    };
    if (form.elements.size.value) init.size = form.elements.size.value;
    const current = { socket: new MessageSocket("realtime", wsUrl(PATH)), nextEventId: 1 };
    session = current;
    setStatus("Connecting…");
    try {
      await current.socket.opened;
      current.socket.send(msgpack.encode(init));
      setStatus(`Streaming (${init.realtime_output_format}).`);
      player.start(fps);
      canvas.focus();
      await readLoop(current);
    } catch (error) {
      const close = current.socket.closeEvent;
      if (close && close.code === 1000 && error.code === "closed") {
        setStatus(`Session ended: ${close.reason || "closed"}.`);
      } else if (!current.stopping) {
        showError(errorBox, error);
        setStatus("Session ended with an error.");
      }
    } finally {
      current.socket.close();
      if (session === current) session = null;
      setRunning(false);
    }
  }

  function stop() {
    if (!session) return;
    session.stopping = true;
    session.socket.close(1000, "client stop");
    player.stop();
    setStatus("Stopped.");
  }

  form.addEventListener("submit", (event) => { event.preventDefault(); if (!session) start(); });
  el("stop").addEventListener("click", stop);
  el("prompt").addEventListener("click", () => {
    const prompt = form.elements.next_prompt.value.trim();
    if (prompt) sendEvent("prompt", prompt);
  });
  window.addEventListener("keydown", (event) => onKey(event, true));
  window.addEventListener("keyup", (event) => onKey(event, false));
  window.addEventListener("blur", () => { if (held.size) { held.clear(); sendKeys(); } });
  window.addEventListener("pagehide", () => session?.socket.close());
  return { setActive(value) { active = value; } };
}
