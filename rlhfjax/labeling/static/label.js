// The labeling page: keyboard shortcuts, and a submission that is retried until the server says it
// is stored. The submission waits in localStorage until then (each of the labeler's tabs may keep
// one: they are kept by submission id, side by side) and is sent again after a reload, the oldest
// first, with the same id, so the server stores it once. It is thrown away only
// when the server refuses the answer itself (invalid, or not this labeler's assignment): a
// refusal about the session (signed out, or a CSRF token from before signing in again) keeps it.
// Each submission names the pair (its id and its texts' hash, uid) and the left/right order it was
// given on, so the server stores it on that pair in that order or refuses it, whatever happened to
// the assignment meanwhile, and the label its page showed (base), so that a page drawn before the
// label last changed (another tab's) cannot replace it. What the browser keeps is keyed by the
// labeling database's own id as well as the labeler: databases served one after another at the
// same address (a pilot, then the real round) each get their own, sent only to that database.
// Answers not yet submitted (and a flag's comment) are kept as a draft across reloads, one per
// assignment, brought back for that assignment, pair and order only.
(function () {
  "use strict";
  const form = document.getElementById("label-form");
  if (!form) return;
  const owner = `${form.dataset.database || ""}:${form.dataset.labeler || ""}`;
  const PENDING = `rlhfjax-pending-label:${owner}`;
  const draftKey = (assignment) => `rlhfjax-draft:${owner}:${assignment}`;
  const DRAFT = draftKey(form.dataset.assignment);
  const here = {assignment: form.dataset.assignment, pair: Number(form.dataset.pair),
                swapped: Number(form.dataset.swapped), uid: form.dataset.uid};
  const RETRY = new Set([408, 425, 429]);  // Refusals that may pass later; 5xx too.
  const SIGN_IN_DELAY_MS = 1500;  // Long enough to read why the page goes to the sign-in form.
  const questions = Array.from(form.querySelectorAll("fieldset.question"));
  const status = document.getElementById("status");
  const bar = document.getElementById("statusbar");  // Fixed at the bottom: always in view.
  const started = performance.now();
  let current = 0;
  let sending = false;

  function focusQuestion(i) {
    current = Math.max(0, Math.min(questions.length - 1, i));
    questions.forEach((q, j) => q.classList.toggle("current", j === current));
    questions[current].scrollIntoView({block: "nearest"});
  }

  function answered(q) { return q.querySelector("input:checked") !== null; }

  function firstUnanswered(from) {
    for (let k = 0; k < questions.length; k++) {
      const j = (from + k) % questions.length;
      if (!answered(questions[j])) return j;
    }
    return -1;
  }

  function newId() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function showProgress(progress) {
    document.getElementById("done").textContent = progress.mine;
    document.getElementById("open").textContent = progress.open_to_me;
    document.getElementById("share").textContent =
        `${progress.everyone ? Math.round(100 * progress.mine / progress.everyone) : 0}% of all labels`;
  }

  function csrfNow() { return form.elements.csrf.value; }

  // The status line and its bar's colour: "pending" (not saved yet), "saved" or "failed".
  function say(text, state) {
    status.textContent = text;
    bar.className = state || "";
  }

  function store(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (err) {
      // Storage full or disabled: the label is still sent from memory while the page stays open.
    }
  }

  // A kept submission as this page can send it (a damaged one has nothing to resend).
  function sendable(entry) {
    const p = entry && entry.payload;
    return Boolean(entry && typeof entry === "object" &&
                   /^[0-9]+$/.test(String(entry.assignment)) && p && typeof p === "object" &&
                   typeof p.csrf === "string" && typeof p.submission === "string" &&
                   p.answers && typeof p.answers === "object");
  }

  // The labeler's kept submissions by id; damaged entries are removed. (A page of an earlier
  // version kept a single entry in the same place: it is read as one.)
  function kept() {
    let raw;
    try {
      raw = JSON.parse(localStorage.getItem(PENDING) || "null");
    } catch (err) {
      raw = undefined;
    }
    if (raw === null) return {};
    const entries = raw && typeof raw === "object" ?
        (raw.payload ? [raw] : Object.values(raw)) : [];
    const out = {};
    entries.forEach((entry) => { if (sendable(entry)) out[entry.payload.submission] = entry; });
    if (!raw || typeof raw !== "object" || raw.payload ||
        Object.keys(out).length !== entries.length) {
      save(out);
    }
    return out;
  }

  function save(entries) {
    if (Object.keys(entries).length) {
      store(PENDING, entries);
    } else {
      localStorage.removeItem(PENDING);
    }
  }

  function keep(pending) {
    const entries = kept();
    entries[pending.payload.submission] = pending;
    save(entries);
  }

  // Forgets this submission only: another tab's stays until that tab, or a reload, has sent it.
  function forget(pending) {
    const entries = kept();
    delete entries[pending.payload.submission];
    save(entries);
  }

  function checkedAnswers() {
    const answers = {};
    questions.forEach((q) => {
      const input = q.querySelector("input:checked");
      if (input) answers[q.dataset.field] = input.value;
    });
    return answers;
  }

  function saveDraft() {
    const comment = document.getElementById("flag-comment");
    store(DRAFT, {...here, answers: checkedAnswers(), comment: comment ? comment.value : ""});
  }

  function dropDraft() { localStorage.removeItem(DRAFT); }

  function readDraft() {
    try {
      const draft = JSON.parse(localStorage.getItem(DRAFT) || "null");
      return draft && typeof draft === "object" && draft.answers &&
             typeof draft.answers === "object" ? draft : null;
    } catch (err) {
      return null;
    }
  }

  // The draft of this very assignment, pair and order, back in the form.
  function restoreDraft() {
    const draft = readDraft();
    if (!draft || draft.assignment !== here.assignment || draft.pair !== here.pair ||
        draft.swapped !== here.swapped || draft.uid !== here.uid) return false;
    let restored = false;
    questions.forEach((q) => {
      const value = draft.answers[q.dataset.field];
      const input = typeof value === "string" &&
          Array.from(q.querySelectorAll("input")).find((i) => i.value === value);
      if (input && !input.checked) {
        input.checked = true;
        restored = true;
      }
    });
    const comment = document.getElementById("flag-comment");
    if (comment && typeof draft.comment === "string" && draft.comment && !comment.value) {
      comment.value = draft.comment;
      document.getElementById("flag-box").open = true;
      restored = true;
    }
    return restored;
  }

  // The labeler's oldest kept submission, or null.
  function waiting() {
    const entries = Object.values(kept());
    entries.sort((a, b) => (Number(a.kept) || 0) - (Number(b.kept) || 0));
    return entries.length ? entries[0] : null;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function deliver(pending) {
    sending = true;
    let freshToken = false;  // Whether the 403 retry with this page's CSRF token was made.
    for (let attempt = 0; ; attempt++) {
      say(attempt ? `Not saved yet: retrying (${attempt})…` : "Saving…", "pending");
      let response = null;
      let body = {};
      try {
        response = await fetch(`/label/${pending.assignment}`, {
          method: "POST", credentials: "same-origin",
          headers: {"Content-Type": "application/json", "X-CSRF-Token": pending.payload.csrf},
          body: JSON.stringify(pending.payload)});
        body = await response.json().catch(() => ({}));
      } catch (err) {
        response = null;  // The network or the server is down: keep the label and try again.
      }
      if (response !== null) {
        const reason = (body && typeof body.error === "string" && body.error) ||
                       `HTTP ${response.status}`;
        if (response.ok) {
          forget(pending);
          localStorage.removeItem(draftKey(pending.assignment));
          if (body.progress) showProgress(body.progress);
          say("Saved.", "saved");
          location.assign(body.status === "revised" ? "/?did=revised" : "/?did=saved");
          return;
        }
        if (response.status === 401 && body.reason === "revoked") {
          say("An admin signed you out: this answer was not saved. This browser keeps it and " +
              "sends it to this same pair only, if you are let back in.", "failed");
          setTimeout(() => location.assign("/login"), 2 * SIGN_IN_DELAY_MS);
          return;  // Still `sending`: the page leaves.
        }
        if (response.status === 401) {  // Signed out or the session expired: keep the label.
          say("Signed out: sign in again; your label is kept and will be sent.", "pending");
          setTimeout(() => location.assign("/login"), SIGN_IN_DELAY_MS);
          return;  // Still `sending`: the page leaves.
        }
        if (response.status === 403) {
          if (!freshToken && pending.payload.csrf !== csrfNow()) {
            // Made on a page of an earlier session: this page's token is the session's now.
            freshToken = true;
            pending.payload.csrf = csrfNow();
            keep(pending);
            continue;
          }
          say(`Not saved yet (${reason}): your label is kept; reload the page or sign in again ` +
              "to send it.", "pending");
          sending = false;
          return;
        }
        if (response.status < 500 && !RETRY.has(response.status)) {
          // The answer itself is refused (invalid, or not this labeler's assignment): sending it
          // again cannot help.
          forget(pending);
          say(`Not saved, and not kept: ${reason}` +
              (pending.assignment === form.dataset.assignment ? "" :
               ` (an earlier label, for pair ${pending.assignment})`), "failed");
          sending = false;
          const first = firstUnanswered(0);
          focusQuestion(first === -1 ? 0 : first);
          return;
        }
      }
      await sleep(Math.min(8000, 500 * 2 ** attempt));
    }
  }

  function submit() {
    if (sending) return;
    const missing = firstUnanswered(0);
    if (missing !== -1) {
      focusQuestion(missing);
      say("Answer every question first.", "failed");
      return;
    }
    const pending = {assignment: here.assignment, kept: Date.now(), payload: {
      csrf: csrfNow(), submission: newId(), answers: checkedAnswers(), pair: here.pair,
      uid: here.uid, base: form.dataset.base, swapped: here.swapped,
      seconds: (performance.now() - started) / 1000}};
    keep(pending);
    deliver(pending);
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  questions.forEach((q, i) => q.addEventListener("change", () => {
    saveDraft();
    const next = firstUnanswered(i + 1);
    focusQuestion(next === -1 ? i : next);
  }));
  const flagBox = document.getElementById("flag-box");
  const skipForm = document.getElementById("skip-form");
  const flagForm = document.getElementById("flag-form");
  const flagComment = document.getElementById("flag-comment");
  if (flagComment) flagComment.addEventListener("input", saveDraft);
  // Skipping or flagging ends this assignment: its draft goes (a failed request says so itself).
  [skipForm, flagForm].forEach((f) => f && f.addEventListener("submit", dropDraft));
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || sending) return;
    // Typing a flag's comment is typing, not answering.
    if (e.target instanceof Element && e.target.closest("textarea, input[type=text]")) return;
    // A focused link or button (the menu, Sign out, Submit) keeps its own Enter and Space.
    if (e.target instanceof Element && e.target.closest("a, button") &&
        (e.key === "Enter" || e.key === " ")) return;
    if (/^[1-9]$/.test(e.key)) {
      const input = questions[current].querySelector(`input[data-key="${e.key}"]`);
      if (input) {
        input.checked = true;
        input.dispatchEvent(new Event("change", {bubbles: true}));
        e.preventDefault();
      }
    } else if (e.key === "ArrowDown") {
      focusQuestion(current + 1);
      e.preventDefault();
    } else if (e.key === "ArrowUp") {
      focusQuestion(current - 1);
      e.preventDefault();
    } else if (e.key === "Enter") {
      e.preventDefault();
      submit();
    } else if ((e.key === "u" || e.key === "U") && form.dataset.last) {
      location.assign(`/label/${form.dataset.last}`);
    } else if ((e.key === "s" || e.key === "S") && skipForm) {
      e.preventDefault();
      dropDraft();
      skipForm.submit();
    } else if ((e.key === "f" || e.key === "F") && flagBox) {
      e.preventDefault();
      flagBox.open = true;
      document.getElementById("flag-comment").focus();
    }
  });

  if (/[?&]did=/.test(location.search)) history.replaceState(null, "", location.pathname);
  if (restoreDraft() && !status.textContent) say("Your unsent answers are back (a draft).", "");
  const first = firstUnanswered(0);
  focusQuestion(first === -1 ? 0 : first);
  const earlier = waiting();
  if (earlier) deliver(earlier);
})();
