// Images tab: POST /v1/images/generations, shown as an <img> with the request as curl.

import { copyText, curlCommand, requestJson } from "./api.js";
import { PlaygroundError, showError } from "./errors.js";
import { compact, optionalInt, setBusy, text } from "./form.js";

const PATH = "/v1/images/generations";

function requestBody(form) {
  return compact({
    prompt: text(form, "prompt"),
    size: form.elements.size.value,
    num_inference_steps: optionalInt(form, "steps"),
    seed: optionalInt(form, "seed"),
    n: 1,
    response_format: "url",
  });
}

function imageSource(item) {
  if (item.url) return item.url;
  if (item.b64_json) return `data:image/png;base64,${item.b64_json}`;
  throw new PlaygroundError("images", { message: "the response has neither url nor b64_json" });
}

export function mount(section) {
  const form = section.querySelector("#images-form");
  const errorBox = form.querySelector(".error");
  const img = section.querySelector("#images-output");
  const meta = section.querySelector("#images-meta");
  const curl = section.querySelector("#images-curl");
  const updateCurl = () => { curl.textContent = curlCommand("POST", PATH, requestBody(form)); };

  form.addEventListener("input", updateCurl);
  section.querySelector("#images-copy").addEventListener("click", () => copyText(curl.textContent, curl));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = requestBody(form);
    curl.textContent = curlCommand("POST", PATH, body);
    showError(errorBox, null);
    setBusy(form, true);
    meta.textContent = "Generating…";
    const started = performance.now();
    try {
      const result = await requestJson("images", "POST", PATH, body);
      const item = result.data[0];
      img.src = imageSource(item);
      await img.decode().catch(() => {
        throw new PlaygroundError("images", { message: `the browser could not decode the image at ${img.src.slice(0, 80)}` });
      });
      img.hidden = false;
      img.dataset.imageId = result.id;
      const seconds = ((performance.now() - started) / 1000).toFixed(2);
      const size = `${img.naturalWidth}×${img.naturalHeight}`;
      const server = result.inference_time_s != null ? `, server ${result.inference_time_s.toFixed(2)} s` : "";
      meta.textContent = `${size}, ${seconds} s round trip${server} — id ${result.id}`;
    } catch (error) {
      meta.textContent = "No image.";
      showError(errorBox, error);
    } finally {
      setBusy(form, false);
    }
  });
  updateCurl();
  return {};
}
