// The page's views by name, so a module can redraw another without importing it.
// app.js defines them once, in the order a full redraw draws them.

const views = new Map();

export function defineViews(byName) {
  for (const [name, draw] of Object.entries(byName)) views.set(name, draw);
}

export function render(...names) {
  for (const name of names) views.get(name)();
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
    for (const v of views.keys()) if (todo.includes(v)) views.get(v)();
  });
}
