"""The browser tests' blank-frame sampler: run in the page for `ms` milliseconds, it looks at every animation
frame and counts the frames in which a chart on screen is blank (its plot not drawn) or fewer charts are on
screen than at the start. On screen: not in a closed expander, not a stale element Streamlit is about to drop
(those are zero pixels tall)."""

CHARTS = '[data-testid="stVegaLiteChart"]'  # every chart of the dashboard is Vega-Lite
# true once at least `least` charts on screen have drawn (a canvas or the SVG marks)
DRAWN = """([charts, least]) => [...document.querySelectorAll(charts)].filter(c => !c.closest('details:not([open])')
    && c.getBoundingClientRect().height >= 20 && c.querySelector('canvas, svg.marks')).length >= least"""
SAMPLER = """(ms) => new Promise(resolve => {
  const CHARTS = '""" + CHARTS.replace("'", "\\'") + """';
  const onScreen = () => [...document.querySelectorAll(CHARTS)]
    .filter(c => !c.closest('details:not([open])') && c.getBoundingClientRect().height >= 20);
  const first = onScreen().length;
  const seen = {frames: 0, blank: 0, fewer: 0, first: first, min: first, notes: []};
  const end = performance.now() + ms;
  function look() {
    const now = onScreen();
    const blank = now.filter(c => !c.querySelector('.main-svg, canvas, svg.marks')).length;
    seen.frames++;
    seen.min = Math.min(seen.min, now.length);
    if (blank) seen.blank++;
    if (now.length < first) seen.fewer++;
    if ((blank || now.length < first) && seen.notes.length < 5) {
      seen.notes.push(`${now.length} on screen, ${blank} blank at ${Math.round(performance.now())} ms`);
    }
    if (performance.now() < end) requestAnimationFrame(look); else resolve(seen);
  }
  requestAnimationFrame(look);
})"""
