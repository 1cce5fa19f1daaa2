// The console's only script: refresh the live parts of a page, follow a run's steps, and count
// leases down.
(function () {
  "use strict";

  function refresh(box) {
    var every = parseInt(box.getAttribute("data-every"), 10) || 2000;
    var url = box.getAttribute("data-refresh");
    function tick() {
      if (document.hidden) { return window.setTimeout(tick, every); }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (answer) { return answer.ok ? answer.text() : null; })
        .then(function (html) {
          if (html !== null) { box.innerHTML = html; box.setAttribute("data-refreshed", Date.now()); countdowns(box); }
        })
        .catch(function () { /* the next tick tries again */ })
        .finally(function () { window.setTimeout(tick, every); });
    }
    window.setTimeout(tick, every);
  }

  // A lease's time left: the server's own figure (data-until - data-now), counted down locally.
  function countdowns(root) {
    var loaded = Date.now();
    root.querySelectorAll("[data-until]").forEach(function (el) {
      var left = Date.parse(el.getAttribute("data-until")) - Date.parse(el.getAttribute("data-now"));
      el.setAttribute("data-left", left);
      el.setAttribute("data-loaded", loaded);
    });
  }

  function show(ms) {
    var s = ms / 1000;
    if (s <= 0) { return "expired " + (-s).toFixed(1) + "s ago"; }
    if (s < 120) { return s.toFixed(1) + "s"; }
    return (s / 60).toFixed(1) + "m";
  }

  function tickCountdowns() {
    var now = Date.now();
    document.querySelectorAll("[data-left]").forEach(function (el) {
      var left = parseFloat(el.getAttribute("data-left")) - (now - parseFloat(el.getAttribute("data-loaded")));
      el.textContent = show(left);
    });
  }

  // A run's steps as they are written: the page holds the events up to data-stream's
  // ?after=, the stream sends each later one once (a reconnect resumes by Last-Event-ID).
  function cell(row, text, cls) {
    var td = document.createElement("td");
    if (cls) { td.className = cls; }
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function follow(table) {
    var body = table.querySelector("tbody");
    var source = new EventSource(table.getAttribute("data-stream"), { withCredentials: true });
    function state(run) {
      var shown = document.getElementById("run-state");
      if (shown) { shown.textContent = run.state + (run.end_reason ? " (" + run.end_reason + ")" : ""); }
      var epoch = document.getElementById("run-epoch");
      if (epoch) { epoch.textContent = run.epoch; }
      table.setAttribute("data-state", run.state);
    }
    source.addEventListener("step", function (message) {
      var event = JSON.parse(message.data);
      if (body.querySelector('tr[data-seq="' + event.seq + '"]')) { return; }
      var empty = body.querySelector("tr.no-events");
      if (empty) { empty.remove(); }
      var row = document.createElement("tr");
      row.setAttribute("data-seq", event.seq);
      row.setAttribute("data-epoch", event.epoch);
      row.className = "live";
      cell(row, event.seq, "num");
      cell(row, event.epoch, "num");
      cell(row, event.type);
      // As the server prints a moment: UTC, to the second.
      cell(row, new Date(event.created_at).toISOString().replace("T", " ").slice(0, 19) + " UTC");
      var text = JSON.stringify(event.data, null, 2);
      var details = document.createElement("details");
      var summary = document.createElement("summary");
      summary.textContent = text.length > 80 ? text.slice(0, 79) + "…" : text;
      var pre = document.createElement("pre");
      pre.className = "json";
      pre.textContent = text;
      details.appendChild(summary);
      details.appendChild(pre);
      cell(row, "").appendChild(details);
      body.appendChild(row);
    });
    source.addEventListener("state", function (message) { state(JSON.parse(message.data)); });
    source.addEventListener("end", function (message) {
      state(JSON.parse(message.data));
      source.close();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table[data-stream]").forEach(follow);
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    countdowns(document);
    window.setInterval(tickCountdowns, 500);
  });
})();
