// Reading form fields into request bodies: empty optional fields are left out, so the server's
// model defaults apply (a field sent as null means the same, but omitting keeps curl short).

export function text(form, name) {
  return form.elements[name].value.trim();
}

/** Integer value of a number input, or undefined when empty. */
export function optionalInt(form, name) {
  const raw = form.elements[name].value.trim();
  return raw === "" ? undefined : Number.parseInt(raw, 10);
}

export function optionalFloat(form, name) {
  const raw = form.elements[name].value.trim();
  return raw === "" ? undefined : Number.parseFloat(raw);
}

/** Drop undefined and empty-string values. */
export function compact(body) {
  return Object.fromEntries(Object.entries(body).filter(([, v]) => v !== undefined && v !== ""));
}

/** Disable or enable every control of a form (used while a request runs). */
export function setBusy(form, busy) {
  form.classList.toggle("busy", busy);
  for (const el of form.querySelectorAll("button[type=submit]")) el.disabled = busy;
}
