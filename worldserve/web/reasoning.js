// Live reasoning tab: webcam or a local file, sampled at a chosen fps (canvas -> JPEG), sent
// over WS /v1/streaming/ws with frame_format binary, one frame in flight; replies are shown over
// the video with their latency; Stop sends {"op":"delete"} and waits for "closed".

import { requestJson, wsUrl } from "./api.js";
import { LatencyChart } from "./chart.js";
import { PlaygroundError, showError } from "./errors.js";
import { optionalFloat, optionalInt, text } from "./form.js";
import { MessageSocket } from "./socket.js";

const CONFIG_PATH = "/v1/streaming/config";
const WS_PATH = "/v1/streaming/ws";
const JPEG_QUALITY = 0.85;
const CREATE_TIMEOUT_MS = 30000;
const CLOSE_TIMEOUT_MS = 15000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function describeRetention(r) {
  if (!r) return "–";
  const text = r.max_text_tokens == null ? "no text cap" : `${r.max_text_tokens} text tokens`;
  return `${r.max_video_segments} frames, ${text}, ${r.max_session_tokens} tokens total (${r.eviction_policy})`;
}

async function openSource(form, video) {
  if (form.elements.source.value === "file") {
    const file = form.elements.file.files[0];
    if (!file) throw new PlaygroundError("streaming", { code: "no_file", message: "choose a video file first" });
    video.srcObject = null;
    video.src = URL.createObjectURL(file);
    video.loop = true;
  } else {
    if (!navigator.mediaDevices?.getUserMedia) {
      throw new PlaygroundError("streaming", { code: "no_camera", message: "this browser gives no camera access here (it needs https or localhost)" });
    }
    video.removeAttribute("src");
    video.srcObject = await navigator.mediaDevices.getUserMedia({ video: true, audio: false });
  }
  await video.play();
  while (video.videoWidth === 0) await sleep(20);
}

function closeSource(video) {
  video.pause();
  for (const track of video.srcObject?.getTracks?.() ?? []) track.stop();
  video.srcObject = null;
  const fileUrl = video.src.startsWith("blob:") ? video.src : null;
  if (fileUrl) {
    video.removeAttribute("src");
    video.load(); // detach before revoking, or the element reloads a revoked URL
    URL.revokeObjectURL(fileUrl);
  }
}

/** One JPEG of the video's current frame, at most `maxWidth` wide. */
function grabFrame(video, canvas, maxWidth) {
  const scale = Math.min(1, maxWidth / video.videoWidth);
  canvas.width = Math.round(video.videoWidth * scale);
  canvas.height = Math.round(video.videoHeight * scale);
  canvas.getContext("2d").drawImage(video, 0, 0, canvas.width, canvas.height);
  return new Promise((resolve, reject) => canvas.toBlob(
    (blob) => (blob ? resolve(blob) : reject(new Error("the canvas could not be encoded as JPEG"))),
    "image/jpeg", JPEG_QUALITY));
}

function serverError(message) {
  return new PlaygroundError("streaming", { status: message.code, code: message.code, message: message.message });
}

export function mount(section) {
  const form = section.querySelector("#reasoning-form");
  const el = (id) => section.querySelector(`#reasoning-${id}`);
  const errorBox = form.querySelector(".error");
  const video = el("video");
  const chart = new LatencyChart(el("chart"));
  const grabCanvas = document.createElement("canvas");
  let run = null; // {socket, running, loop}

  form.elements.source.addEventListener("change", () => {
    form.querySelector(".file-only").hidden = form.elements.source.value !== "file";
  });

  function setRunning(running) {
    el("start").disabled = running;
    el("stop").disabled = !running;
    section.dataset.state = running ? "running" : "stopped";
  }

  function showReply(reply, roundTripMs, count) {
    el("overlay").hidden = false;
    el("text").textContent = reply.text || "(empty reply)";
    const server = reply.latency_s != null ? ` · server ${Math.round(reply.latency_s * 1000)} ms` : "";
    el("latency").textContent = `frame ${reply.frame_index} · ${Math.round(roundTripMs)} ms round trip${server}`;
    el("count").textContent = String(count);
    chart.add(roundTripMs, reply.latency_s != null ? reply.latency_s * 1000 : null);
  }

  async function frameLoop(current, fps, maxWidth) {
    let count = 0;
    let nextDue = performance.now();
    while (current.running) {
      await sleep(Math.max(0, nextDue - performance.now()));
      if (!current.running) break;
      nextDue = performance.now() + 1000 / fps;
      const blob = await grabFrame(video, grabCanvas, maxWidth);
      const started = performance.now();
      current.socket.send(await blob.arrayBuffer());
      const reply = await current.socket.next();
      if (reply.op === "frame") {
        count += 1;
        showReply(reply, performance.now() - started, count);
      } else if (reply.op === "error") {
        showError(errorBox, serverError(reply));
        if (reply.fatal) throw serverError(reply);
      }
    }
  }

  async function start() {
    showError(errorBox, null);
    setRunning(true);
    chart.clear();
    el("count").textContent = "0";
    el("overlay").hidden = true;
    try {
      const config = await requestJson("streaming", "GET", CONFIG_PATH);
      el("model").textContent = config.model;
      await openSource(form, video);
      const socket = new MessageSocket("streaming", wsUrl(WS_PATH), { decode: (data) => (typeof data === "string" ? JSON.parse(data) : { op: "binary" }) });
      await socket.opened;
      socket.send(JSON.stringify({
        op: "create", frame_format: "binary",
        system_prompt: text(form, "system_prompt"), question: text(form, "question"),
        fps: optionalFloat(form, "fps") ?? 1.0,
        sampling: { max_tokens: optionalInt(form, "max_tokens") ?? 24 },
      }));
      const created = await socket.next(CREATE_TIMEOUT_MS);
      if (created.op === "error") throw serverError(created);
      if (created.op !== "created") throw new PlaygroundError("streaming", { message: `unexpected first message op '${created.op}'` });
      el("session").textContent = created.session_id;
      el("retention").textContent = describeRetention(created.retention);
      section.dataset.sessionId = created.session_id;
      run = { socket, running: true, loop: null };
      run.loop = frameLoop(run, optionalFloat(form, "fps") ?? 1.0, optionalInt(form, "width") ?? 448);
      await run.loop;
    } catch (error) {
      if (!run?.stopping) showError(errorBox, error);
      run?.socket.close();
      run = null;
      closeSource(video);
      setRunning(false);
    }
  }

  async function stop() {
    const current = run;
    if (!current) return;
    current.running = false;
    current.stopping = true;
    el("stop").disabled = true;
    try {
      await current.loop; // the frame in flight gets its reply first (one frame in flight)
      current.socket.send(JSON.stringify({ op: "delete" }));
      let message = await current.socket.next(CLOSE_TIMEOUT_MS);
      while (message.op === "frame") message = await current.socket.next(CLOSE_TIMEOUT_MS);
      if (message.op === "error") throw serverError(message);
      el("session").textContent = `${message.session_id} — closed after ${message.frames} frames`;
      section.dataset.state = "closed";
      section.dataset.closedFrames = String(message.frames);
    } catch (error) {
      showError(errorBox, error);
    } finally {
      current.socket.close();
      closeSource(video);
      if (run === current) run = null;
      el("start").disabled = false;
    }
  }

  form.addEventListener("submit", (event) => { event.preventDefault(); if (!run) start(); });
  el("stop").addEventListener("click", stop);
  window.addEventListener("pagehide", () => run?.socket.close());
  return {};
}
