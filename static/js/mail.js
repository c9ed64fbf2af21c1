// The outbox: an email's HTML frame grows to the whole email, so nothing of it (the
// Decide link, the footer) hides behind a scroll of the frame's own. The frame keeps
// the desk's origin only so that this script can measure it: it is sandboxed without
// scripts, forms or navigation (the iframe's sandbox and the part's own policy).
(function () {
  "use strict";

  function fit(frame) {
    var doc = frame.contentDocument;
    if (!doc || !doc.documentElement || doc.URL === "about:blank") { return; }
    frame.style.height = "150px"; // shrink first: a frame never measures less than itself
    var borders = frame.offsetHeight - frame.clientHeight;
    frame.style.height = doc.documentElement.scrollHeight + borders + "px";
  }

  function fitAll() {
    document.querySelectorAll("iframe[data-fit-content]").forEach(fit);
  }

  document.querySelectorAll("iframe[data-fit-content]").forEach(function (frame) {
    frame.addEventListener("load", function () { fit(frame); });
    if (frame.contentDocument && frame.contentDocument.readyState === "complete") { fit(frame); }
  });
  var pending = null;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(fitAll, 100);
  });
})();
