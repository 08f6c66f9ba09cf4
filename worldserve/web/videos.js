// Videos tab: a job (POST /v1/videos), its progress (polling GET /v1/videos/{id}), the player
// (GET .../content) and DELETE.

import { copyText, curlCommand, requestJson } from "./api.js";
import { PlaygroundError, showError } from "./errors.js";
import { compact, optionalInt, setBusy, text } from "./form.js";

const PATH = "/v1/videos";
const POLL_INTERVAL_MS = 400;
const TERMINAL = new Set(["completed", "failed", "cancelled", "deleted"]);

function requestBody(form) {
  return compact({
    prompt: text(form, "prompt"),
    size: form.elements.size.value,
    num_frames: optionalInt(form, "num_frames"),
    fps: optionalInt(form, "fps"),
    num_inference_steps: optionalInt(form, "steps"),
    seed: optionalInt(form, "seed"),
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export function mount(section) {
  const form = section.querySelector("#videos-form");
  const errorBox = form.querySelector(".error");
  const status = section.querySelector("#videos-status");
  const progress = section.querySelector("#videos-progress");
  const player = section.querySelector("#videos-player");
  const jobView = section.querySelector("#videos-job");
  const deleteButton = section.querySelector("#videos-delete");
  const curl = section.querySelector("#videos-curl");
  let job = null; // the job shown; a new job replaces it and stops the old poll
  let generation = 0;

  const updateCurl = () => { curl.textContent = curlCommand("POST", PATH, requestBody(form)); };

  function render(current) {
    job = current;
    progress.value = current.progress ?? 0;
    status.textContent = `${current.status} — ${current.progress ?? 0}%`;
    status.dataset.status = current.status;
    jobView.textContent = JSON.stringify(current, null, 2);
    deleteButton.disabled = current.status === "deleted";
    section.dataset.jobStatus = current.status;
  }

  async function follow(id, token) {
    while (token === generation) {
      const current = await requestJson("videos", "GET", `${PATH}/${encodeURIComponent(id)}`);
      if (token !== generation) return;
      render(current);
      if (TERMINAL.has(current.status)) return current;
      await sleep(POLL_INTERVAL_MS);
    }
  }

  function play(current) {
    player.src = current.url || `${PATH}/${encodeURIComponent(current.id)}/content`;
    player.hidden = false;
    player.play().catch(() => { /* autoplay may be refused; the controls stay usable */ });
  }

  form.addEventListener("input", updateCurl);
  section.querySelector("#videos-copy").addEventListener("click", () => copyText(curl.textContent, curl));
  player.addEventListener("error", () => {
    if (player.hidden) return;
    showError(errorBox, new PlaygroundError("videos", { message: `the browser could not play ${player.src}` }));
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = requestBody(form);
    curl.textContent = curlCommand("POST", PATH, body);
    const token = ++generation;
    showError(errorBox, null);
    setBusy(form, true);
    player.hidden = true;
    player.removeAttribute("src");
    try {
      render(await requestJson("videos", "POST", PATH, body));
      const final = await follow(job.id, token);
      if (final?.status === "completed") play(final);
      else if (final && final.status !== "deleted") {
        const reason = final.error?.message || `the job ended as ${final.status}`;
        showError(errorBox, new PlaygroundError("videos", { code: final.error?.code || final.status, message: reason }));
      }
    } catch (error) {
      if (token === generation) showError(errorBox, error);
    } finally {
      setBusy(form, false);
    }
  });

  deleteButton.addEventListener("click", async () => {
    if (!job) return;
    generation++; // stop following the job
    showError(errorBox, null);
    deleteButton.disabled = true;
    try {
      const result = await requestJson("videos", "DELETE", `${PATH}/${encodeURIComponent(job.id)}`);
      player.pause();
      player.hidden = true;
      player.removeAttribute("src");
      render(result);
    } catch (error) {
      deleteButton.disabled = false;
      showError(errorBox, error);
    }
  });
  updateCurl();
  return {};
}
