// The page's icons: path data of a 24×24 box, drawn by dom.js's icon().

export const ICON_BRANCH = [
  "M6 3v12", "M18 9a3 3 0 1 0 0-6 3 3 0 0 0 0 6z", "M6 21a3 3 0 1 0 0-6 3 3 0 0 0 0 6z",
  "M18 9a9 9 0 0 1-9 9",
];
export const ICON_RESUME = ["M5 4l14 8-14 8z"];
export const ICON_STEPS = ["M4 6h16", "M4 12h10", "M4 18h13"];
// Drawn, not emoji: a machine without an emoji font would show empty boxes.
export const ICON_REFUSED = ["M12 21a9 9 0 1 0 0-18 9 9 0 0 0 0 18z", "M5.7 5.7l12.6 12.6"];
export const ICON_ASK = [
  "M12 21a9 9 0 1 0 0-18 9 9 0 0 0 0 18z", "M9.5 9.5a2.5 2.5 0 1 1 3.5 2.3c-.6.3-1 .9-1 1.6v.6",
  "M12 17.5h.01",
];
