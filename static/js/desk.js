// Keyboard shortcuts for the desk. Plain DOM, no build step.
//   queue:         j / k move the selection, Enter or o opens it
//   approval page: j / k next / previous waiting item, n the next one yours to decide,
//                  c claim, a approve, d decline, r respond instead (d and r put the
//                  cursor in the comment first: both need text; then Ctrl+Enter does it).
//                  Ctrl+Enter never approves: approving is a, or the button.
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
    // The offer in the decision region is the freshest (it came with the decision).
    if (event.key === "n" && (click('#decision [data-key="n"]') || click('[data-key="n"]'))) {
      event.preventDefault(); return;
    }
    if (event.key === "c" && click('button[data-key="c"]')) { event.preventDefault(); return; }
    if (event.key === "a" && click('button[data-key="a"]')) { event.preventDefault(); return; }
    if (event.key === "d" || event.key === "r") {
      var comment = document.getElementById("comment");
      if (!comment) { return; }
      event.preventDefault();
      var intent = event.key === "d" ? "decline" : "respond";
      if (comment.value.trim()) { click('button[data-key="' + event.key + '"]'); return; }
      comment.dataset.intent = intent;
      comment.focus();
      hint(intent === "decline"
        ? "Why decline? The model is told. Then Ctrl+Enter declines."
        : "What should the model be told instead? Nothing runs. Then Ctrl+Enter responds.");
    }
  });

  function hint(text) {
    var el = document.getElementById("comment-hint");
    if (el) { el.textContent = text; el.classList.add("asking"); }
  }

  // Fragments that refresh themselves (the queue's rows, the nav's counts, the approval
  // page's status) carry the ETag of what they show (data-etag): their poll asks
  // "changed since?" and a 304, nothing changed, leaves them as they are (htmx would
  // swap its empty body in). approvals/decisions/freshness.py says what the tag covers.
  document.addEventListener("htmx:configRequest", function (event) {
    var elt = event.detail.elt;
    if (event.detail.verb === "get" && elt && elt.dataset && elt.dataset.etag) {
      event.detail.headers["If-None-Match"] = elt.dataset.etag;
    }
  });
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (event.detail.xhr && event.detail.xhr.status === 304) {
      event.detail.shouldSwap = false;
      event.detail.isError = false;
    }
  });

  // A request whose element left the page meanwhile (the status poll in flight as a
  // decision's answer replaced the status region) is not swapped: its out-of-band
  // fragments would look for their targets in the detached element, find none and
  // log htmx:oobErrorNoTarget. The page already shows what the decision brought.
  // (beforeSwap fires on the element itself, which no longer reaches the document.)
  document.addEventListener("htmx:beforeRequest", function (event) {
    var elt = event.detail.elt;
    elt.addEventListener("htmx:beforeSwap", function (swap) {
      if (!document.body.contains(elt)) { swap.detail.shouldSwap = false; }
    }, { once: true });
  });

  // A click anywhere on a queue row opens it (the first cell keeps a real link).
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("tr[data-href]");
    if (row && !event.target.closest("a, button, input, select, textarea")) {
      window.location.href = row.dataset.href;
    }
  });

  // Ctrl/Cmd+Enter in the comment declines or responds, as d or r said; it never
  // approves. With nothing typed it does nothing but say what to do; with text and no
  // d or r before it, it asks which.
  document.addEventListener("keydown", function (event) {
    var comment = event.target;
    if (!comment || comment.id !== "comment" || event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) {
      return;
    }
    event.preventDefault();
    if (!comment.value.trim()) {
      hint("Nothing typed, so nothing was sent. Type a reason, then Ctrl+Enter declines (after d) "
        + "or responds (after r). To approve, press Esc then a, or click Approve.");
      return;
    }
    if (comment.dataset.intent === "decline") { click('button[data-key="d"]'); return; }
    if (comment.dataset.intent === "respond") { click('button[data-key="r"]'); return; }
    hint("Decline or respond with this comment? Press Esc, then d to decline or r to respond "
      + "(or click the button).");
  });
})();
