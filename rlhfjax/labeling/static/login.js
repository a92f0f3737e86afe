// The sign-in link carries its one-time token after '#', which the browser never sends to the
// server: put it in the form, then drop it from the address bar and the history. The form is not
// sent by itself: a link previewer that runs scripts must not spend the link.
(function () {
  "use strict";
  // With the token in hand the page asks for one click: the button, focused (Enter works too).
  const token = document.getElementById("token");
  function take() {
    const match = location.hash.match(/^#token=([A-Za-z0-9_-]+)$/);
    if (match && token) {
      token.value = match[1];
      document.getElementById("paste").hidden = true;
      document.getElementById("ready").hidden = false;
      document.getElementById("sign-in").focus();
    }
    if (location.hash || location.search) history.replaceState(null, "", "/login");
  }
  take();
  window.addEventListener("hashchange", take);  // A link opened on this page does not reload it.
  if (token && !token.value) token.focus();
})();
