// mana-ai console: what htmx cannot say by itself. A button whose request never got an
// answer (the server is down, the network failed, it timed out) says so at the top of the
// page; a new request clears what an earlier one said there. Errors the server answered
// (403, 409, 503) come back as a notice the server wrote (HX-Retarget: #flash).
(function () {
  "use strict";
  function say(text) {
    var flash = document.getElementById("flash");
    if (!flash) { return; }
    var p = document.createElement("p");
    p.className = "error";
    p.setAttribute("role", "alert");
    p.textContent = text; // text, never markup
    flash.replaceChildren(p);
  }
  document.addEventListener("htmx:beforeRequest", function () {
    var flash = document.getElementById("flash");
    if (flash) { flash.replaceChildren(); }
  });
  document.addEventListener("htmx:sendError", function () {
    say("The console could not reach the server, so that click may not have taken effect. " +
        "Check that mana-ai serve is running, then reload the page to see where things stand.");
  });
  document.addEventListener("htmx:timeout", function () {
    say("The server did not answer in time: reload the page to see whether it took effect.");
  });
})();
