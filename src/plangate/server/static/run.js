// Live progress on the run page: poll the run's state until it ends.
// A static file, not inline script: the dashboard's CSP allows script from its own origin only.
"use strict";

async function poll(status) {
  const reply = await fetch(status.dataset.progress, {credentials: "same-origin"});
  if (!reply.ok) return;
  const data = await reply.json();
  status.textContent = data.status;
  status.className = "status-" + data.status;
  for (const [id, step] of Object.entries(data.steps)) {
    document.getElementById("status-" + id).textContent = step.status;
    document.getElementById("detail-" + id).textContent = step.detail;
  }
  if (data.status === "running" || data.status === "approved") setTimeout(() => poll(status), 300);
}

document.addEventListener("DOMContentLoaded", () => {
  const status = document.getElementById("run-status");
  if (status) poll(status);
});
