// Times are written in UTC by the server; each gets the reader's local time beside it.
(function () {
  "use strict";
  const format = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit"});
  document.querySelectorAll("time[datetime]").forEach((t) => {
    const moment = new Date(t.getAttribute("datetime"));
    if (isNaN(moment)) return;
    const local = document.createElement("span");
    local.className = "local";
    local.textContent = ` (${format.format(moment)} your time)`;
    t.after(local);
  });
})();
