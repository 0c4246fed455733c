// A table wider than its card (the layouts grid on a phone) shows a shadow at the edge where more
// columns are hidden. The shadows are drawn by the scroller's frame, above the cells: a shadow in
// the scroller's own background would be covered by the coloured fit / tight / oom cells.
export function markScrollEdges(scroller) {
  const frame = scroller.parentElement;
  const update = () => {
    const hidden = scroller.scrollWidth - scroller.clientWidth;
    frame.classList.toggle('more-left', scroller.scrollLeft > 1);
    frame.classList.toggle('more-right', hidden - scroller.scrollLeft > 1);
  };
  scroller.addEventListener('scroll', update, { passive: true });
  const resized = new ResizeObserver(update);
  resized.observe(scroller);
  for (const child of scroller.children) resized.observe(child);
  update();
}
