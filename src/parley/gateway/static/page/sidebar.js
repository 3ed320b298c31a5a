// The sidebar on narrow screens: opened by the topbar's button, closed by a pick, a
// click beside it or Escape.

import { $ } from "./dom.js";

export function closeSidebar() {
  document.body.classList.remove("sidebar-open");
  $("sidebar-toggle").setAttribute("aria-expanded", "false");
}

export function toggleSidebar() {
  const open = document.body.classList.toggle("sidebar-open");
  $("sidebar-toggle").setAttribute("aria-expanded", String(open));
}
