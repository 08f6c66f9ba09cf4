// Playground entry: tab switching, which surfaces this server offers, and the tab modules.

import { offeredSurfaces } from "./api.js";
import { SURFACE_NAMES } from "./errors.js";
import * as images from "./images.js";
import * as videos from "./videos.js";
import * as reasoning from "./reasoning.js";
import * as realtime from "./realtime.js";

const TABS = { images, videos, reasoning, realtime };
const DEFAULT_TAB = "images";
const mounted = {};

function markUnavailable(tab, section) {
  const note = section.querySelector(".unavailable");
  note.textContent = `This server does not offer ${SURFACE_NAMES[section.dataset.surface]}.`;
  const button = document.getElementById(`tabbtn-${tab}`);
  button.classList.add("off");
  button.title = note.textContent;
  note.hidden = false;
  section.classList.add("disabled");
  for (const control of section.querySelectorAll("button, input, select, textarea")) control.disabled = true;
}

function showTab(name) {
  if (!(name in TABS)) name = DEFAULT_TAB;
  for (const [tab, tabModule] of Object.entries(TABS)) {
    const active = tab === name;
    document.getElementById(`tab-${tab}`).hidden = !active;
    const button = document.getElementById(`tabbtn-${tab}`);
    button.setAttribute("aria-selected", String(active));
    button.classList.toggle("active", active);
    mounted[tab]?.setActive?.(active);
  }
}

async function refreshStatus() {
  const label = document.getElementById("server-status");
  try {
    const response = await fetch("/health");
    const body = await response.json();
    label.textContent = `server ${body.status}`;
    label.dataset.state = body.status;
  } catch {
    label.textContent = "server unreachable";
    label.dataset.state = "down";
  }
}

async function main() {
  const offered = await offeredSurfaces();
  for (const [tab, tabModule] of Object.entries(TABS)) {
    const section = document.getElementById(`tab-${tab}`);
    if (offered[section.dataset.surface] === false) {
      markUnavailable(tab, section);
      continue;
    }
    mounted[tab] = tabModule.mount(section);
  }
  for (const button of document.querySelectorAll("[data-tab]")) {
    button.addEventListener("click", () => { window.location.hash = button.dataset.tab; });
  }
  window.addEventListener("hashchange", () => showTab(window.location.hash.slice(1)));
  showTab(window.location.hash.slice(1));
  refreshStatus();
  setInterval(refreshStatus, 5000);
  document.body.dataset.ready = "true";
}

main();
