// The console's only script: refresh the live parts of a page, and count leases down.
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

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    countdowns(document);
    window.setInterval(tickCountdowns, 500);
  });
})();
