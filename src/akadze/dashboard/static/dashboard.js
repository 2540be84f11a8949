// akadze dashboard: refreshes the page's content in place every few seconds (pausable),
// and sends the action forms with their CSRF token, showing the answer. Hand-written, no
// dependencies, nothing fetched from anywhere but this dashboard.
(function () {
  "use strict";
  var body = document.body;
  var content = document.getElementById("content");
  var toggle = document.getElementById("refresh-toggle");
  var stamp = document.getElementById("refreshed");
  var flash = document.getElementById("flash");
  var token = document.querySelector('meta[name="csrf-token"]').content;
  var seconds = parseFloat(body.dataset.refresh) || 5;
  var storageKey = "akadze.dashboard.paused";
  var paused = false;
  var inFlight = false;
  try { paused = window.localStorage.getItem(storageKey) === "1"; } catch (e) { paused = false; }

  function showPaused() {
    toggle.textContent = paused ? "Resume refresh" : "Pause refresh";
    toggle.setAttribute("aria-pressed", paused ? "true" : "false");
    body.dataset.paused = paused ? "1" : "0";
  }

  function refresh(force) {
    if (inFlight || (!force && (paused || document.hidden))) { return Promise.resolve(); }
    inFlight = true;
    return fetch(window.location.href, {
      headers: { "X-Akadze-Partial": "1" }, credentials: "same-origin", cache: "no-store"
    }).then(function (response) {
      return response.text().then(function (html) {
        if (response.ok || response.status < 500) {
          content.innerHTML = html;
          stamp.textContent = "refreshed " + new Date().toLocaleTimeString();
          stamp.classList.remove("stale");
        } else {
          stamp.textContent = "refresh failed (" + response.status + ")";
          stamp.classList.add("stale");
        }
        body.dataset.refreshes = String(parseInt(body.dataset.refreshes, 10) + 1);
      });
    }).catch(function () {
      stamp.textContent = "refresh failed: the dashboard did not answer";
      stamp.classList.add("stale");
    }).then(function () { inFlight = false; });
  }

  function say(ok, message) {
    flash.hidden = false;
    flash.className = ok ? "ok" : "error";
    flash.textContent = message;
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.hasAttribute("data-action")) { return; }
    event.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) { return; }
    var data = new URLSearchParams(new FormData(form));
    fetch(form.action, {
      method: "POST", body: data, credentials: "same-origin",
      headers: { "X-CSRF-Token": token, "Accept": "application/json" }
    }).then(function (response) {
      return response.json().then(function (answer) {
        say(answer.ok, answer.ok ? answer.message : answer.error);
      }, function () { say(false, "the dashboard answered " + response.status); });
    }, function () {
      say(false, "the dashboard did not answer");
    }).then(function () { return refresh(true); });
  });

  toggle.addEventListener("click", function () {
    paused = !paused;
    try { window.localStorage.setItem(storageKey, paused ? "1" : "0"); } catch (e) { /* private mode */ }
    showPaused();
    if (!paused) { refresh(true); }
  });

  showPaused();
  window.setInterval(refresh, seconds * 1000);
})();
