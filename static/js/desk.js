// Keyboard shortcuts for the desk. Plain DOM, no build step.
//   queue:         j / k move the selection, Enter or o opens it
//   approval page: j / k next / previous waiting item, a approve, d decline
//                  (d puts the cursor in the comment first: a decline needs a reason)
(function () {
  "use strict";

  function typing(event) {
    var el = event.target;
    return el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }

  function queueRows() {
    return Array.prototype.slice.call(document.querySelectorAll("[data-keynav] tbody tr[data-href]"));
  }

  function select(rows, index) {
    rows.forEach(function (row) { row.classList.remove("selected"); row.removeAttribute("aria-selected"); });
    var row = rows[Math.max(0, Math.min(index, rows.length - 1))];
    if (row) {
      row.classList.add("selected");
      row.setAttribute("aria-selected", "true");
      row.scrollIntoView({ block: "nearest" });
    }
  }

  function click(selector) {
    var el = document.querySelector(selector);
    if (el) { el.click(); return true; }
    return false;
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (typing(event)) {
      if (event.key === "Escape") { event.target.blur(); }
      return;
    }
    var rows = queueRows();
    if (rows.length) {
      var current = rows.findIndex(function (row) { return row.classList.contains("selected"); });
      if (event.key === "j") { select(rows, current + 1); event.preventDefault(); return; }
      if (event.key === "k") { select(rows, current < 0 ? 0 : current - 1); event.preventDefault(); return; }
      if ((event.key === "Enter" || event.key === "o") && current >= 0) {
        window.location.href = rows[current].dataset.href; event.preventDefault(); return;
      }
    }
    if (event.key === "j" && click('[data-key="j"]')) { event.preventDefault(); return; }
    if (event.key === "k" && click('[data-key="k"]')) { event.preventDefault(); return; }
    if (event.key === "a" && click('button[data-key="a"]')) { event.preventDefault(); return; }
    if (event.key === "d") {
      var comment = document.getElementById("comment");
      if (!comment) { return; }
      event.preventDefault();
      if (comment.value.trim()) { click('button[data-key="d"]'); }
      else { comment.focus(); comment.placeholder = "Why decline? The model is told. Then press Ctrl+Enter."; }
    }
  });

  // A click anywhere on a queue row opens it (the first cell keeps a real link).
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("tr[data-href]");
    if (row && !event.target.closest("a, button, input, select, textarea")) {
      window.location.href = row.dataset.href;
    }
  });

  // Ctrl/Cmd+Enter in the comment declines (or approves if nothing is typed).
  document.addEventListener("keydown", function (event) {
    if (event.target && event.target.id === "comment" && event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      click(event.target.value.trim() ? 'button[data-key="d"]' : 'button[data-key="a"]');
    }
  });
})();
