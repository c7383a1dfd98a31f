// The page's views by name, so a module can redraw another without importing it.
// app.js defines them once, in the order a full redraw draws them.

const views = new Map();

export function defineViews(byName) {
  for (const [name, draw] of Object.entries(byName)) views.set(name, draw);
}

export function render(...names) {
  for (const name of names) whenSettled(name, views.get(name));
}

// A redraw replaces what it draws, so it waits while the user is at work on it: during
// a press (mouse, pen or touch), since a button replaced between its mousedown and its
// mouseup gets no click (the browser sends it to neither copy: on a busy team, whose
// panels a live update redraws every second, a click on "extend", a session or a dead
// letter was lost now and then); and, for a side panel, while a box in it has the focus
// (the redraw would take the box, and the typing, away). The last redraw asked for under
// each name runs once the press is over, its click delivered, and the box left.
let pressed = false;
const held = new Map(); // name -> the redraw to run when settled

function busy(name) {
  if (pressed) return true;
  const a = document.activeElement;
  return !!(a && a.tagName === "INPUT" && a.closest("ul")?.id === name);
}

export function whenSettled(name, draw) {
  if (!busy(name)) return draw();
  held.set(name, draw); // the latest redraw, in the order first asked for (rows: as they came)
}

function settle() {
  // after the events of the release (mouseup, click, focus moves) are dispatched
  setTimeout(() => {
    for (const [name, draw] of [...held]) {
      if (busy(name)) continue;
      held.delete(name);
      draw();
    }
  }, 0);
}

export function watchPresses(doc) {
  const press = () => {
    pressed = true;
  };
  const release = () => {
    pressed = false;
    settle();
  };
  doc.addEventListener("pointerdown", press, true);
  for (const ev of ["pointerup", "pointercancel"]) doc.addEventListener(ev, release, true);
  doc.addEventListener("focusout", settle, true);
  // a release the page never hears of (the window left mid-press) must not hold it forever
  window.addEventListener("blur", release);
}

export function renderAll() {
  for (const draw of views.values()) draw();
}

// Redraws that many events may ask for are batched into one animation frame.
const pending = new Set();
let frameQueued = false;

export function scheduleRender(name) {
  pending.add(name);
  if (frameQueued) return;
  frameQueued = true;
  requestAnimationFrame(() => {
    frameQueued = false;
    const todo = [...pending];
    pending.clear();
    for (const v of views.keys()) if (todo.includes(v)) whenSettled(v, views.get(v));
  });
}
