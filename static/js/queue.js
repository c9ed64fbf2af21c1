// The queue's bulk selection. Plain DOM, no build step; the page works without it
// (the form posts the ticked rows), this only keeps the selection while the rows
// refresh themselves, says how many are ticked, and ticks the selected row on x.
(function () {
  "use strict";

  // Ticked rows by their checkbox value ("id:args_hash"): a row whose arguments were
  // edited since comes back with another value, and unticked (look at it again).
  var picked = new Set();

  function form() { return document.getElementById("bulk-form"); }
  function boxes() { return Array.prototype.slice.call(document.querySelectorAll('#queue-rows input[name="item"]')); }

  function apply() {
    var present = new Set();
    boxes().forEach(function (box) {
      present.add(box.value);
      box.checked = picked.has(box.value);
    });
    picked.forEach(function (value) { if (!present.has(value)) { picked.delete(value); } });
    var all = document.querySelector("#queue-rows [data-select-all]");
    var list = boxes();
    if (all) {
      all.checked = list.length > 0 && list.every(function (box) { return box.checked; });
      all.indeterminate = !all.checked && list.some(function (box) { return box.checked; });
    }
    var count = document.querySelector("[data-testid=bulk-picked]");
    if (count) { count.textContent = picked.size ? picked.size + " selected" : ""; }
  }

  function init() {
    var bulk = form();
    if (!bulk) { return; }
    // What the server ticked (a form that came back with an error) stays ticked.
    boxes().forEach(function (box) { if (box.checked) { picked.add(box.value); } });
    apply();

    // A click on a checkbox or its cell selects; it does not open the row (desk.js
    // opens a row clicked anywhere else).
    bulk.addEventListener("click", function (event) {
      var cell = event.target.closest && event.target.closest("td.pick, th.pick");
      if (!cell) { return; }
      event.stopPropagation();
      if (event.target.tagName !== "INPUT") {
        var box = cell.querySelector("input[type=checkbox]");
        if (box) { box.click(); }
      }
    });

    bulk.addEventListener("change", function (event) {
      var box = event.target;
      if (box.matches("[data-select-all]")) {
        boxes().forEach(function (b) { if (box.checked) { picked.add(b.value); } else { picked.delete(b.value); } });
      } else if (box.name === "item") {
        if (box.checked) { picked.add(box.value); } else { picked.delete(box.value); }
      }
      apply();
    });
  }

  // x ticks (or unticks) the row selected with j / k.
  document.addEventListener("keydown", function (event) {
    if (event.key !== "x" || event.ctrlKey || event.metaKey || event.altKey) { return; }
    var el = event.target;
    if (el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName))) { return; }
    var box = document.querySelector('#queue-rows tr.selected input[name="item"]');
    if (box) { box.click(); event.preventDefault(); }
  });

  document.addEventListener("htmx:afterSettle", function (event) {
    var target = event.detail && event.detail.elt;
    if (!target) { return; }
    if (target.id === "bulk-summary") {
      // Decided: start afresh (the rows refresh themselves on approvalDecided).
      if (target.querySelector("[data-done]")) {
        picked.clear();
        ["bulk-comment", "bulk-note"].forEach(function (id) {
          var field = document.getElementById(id);
          if (field) { field.value = ""; }
        });
      }
    }
    apply();
  });

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
