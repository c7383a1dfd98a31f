// The light / dark switch, remembered in localStorage.

const THEME_KEY = "backchannel.theme";

function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}

export function toggleTheme() {
  const current =
    document.documentElement.dataset.theme ||
    (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
  const next = current === "dark" ? "light" : "dark";
  localStorage.setItem(THEME_KEY, next);
  applyTheme(next);
}

// The theme this browser chose last, if any (else the system's).
export function loadTheme() {
  applyTheme(localStorage.getItem(THEME_KEY));
}
