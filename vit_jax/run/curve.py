"""A run's learning curve as a PNG, drawn with Pillow: train and eval loss (log scale) and top-1
accuracy against the step, in two panels.

Every finished run writes one (`learning_curve.png`), so it is drawn in a few milliseconds rather
than through matplotlib, whose import and layout would cost every command a large share of its
start-up.
`layout(...)` is the pure part (data -> pixel geometry); `render(...)` paints it.
"""

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

WIDTH, HEIGHT = 1000, 400  # pixels of the PNG: two panels side by side
_SCALE = 2  # drawn at twice the size, then reduced: smooth lines without an anti-aliasing renderer
_MARGIN = (56, 30, 14, 40)  # left, top, right, bottom of each panel's plot area
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)  # the usual first two line colours
_GRID, _AXES, _TEXT = (225, 225, 225), (60, 60, 60), (20, 20, 20)


@dataclasses.dataclass(frozen=True)
class Series:
  label: str
  steps: Sequence[float]
  values: Sequence[float]
  color: Tuple[int, int, int]
  markers: bool = False  # a dot at every point (evaluations are few)


@dataclasses.dataclass(frozen=True)
class Panel:
  """Where a panel's data lands: `to_pixel(step, value)` inside `box` (x0, y0, x1, y1)."""
  box: Tuple[int, int, int, int]
  x_range: Tuple[float, float]
  y_range: Tuple[float, float]  # in log10 units when `log`
  log: bool
  x_ticks: List[float]
  y_ticks: List[float]

  def x_pixel(self, step: float) -> float:
    (x0, _, x1, _), (a, b) = self.box, self.x_range
    return x0 + (step - a) / (b - a) * (x1 - x0)

  def y_pixel(self, v: float) -> float:
    """`v` in the axis's units (log10 of the value on a log scale), like `y_range` and `y_ticks`."""
    (_, y0, _, y1), (c, d) = self.box, self.y_range
    return y1 - (v - c) / (d - c) * (y1 - y0)

  def to_pixel(self, step: float, value: float) -> Tuple[float, float]:
    return self.x_pixel(step), self.y_pixel(math.log10(value) if self.log else value)


def nice_ticks(lo: float, hi: float, target: int = 5, integer: bool = False) -> List[float]:
  """Round numbers (1, 2 or 5 times a power of ten apart; at least 1 apart if `integer`)
  covering [lo, hi], about `target` of them."""
  if not hi > lo:  # one value: a range around it
    pad = abs(lo) * 0.1 or 0.5
    lo, hi = lo - pad, hi + pad
  raw = (hi - lo) / target
  power = 10.0 ** math.floor(math.log10(raw))
  step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
  step = max(step, 1.0) if integer else step
  first = math.floor(lo / step + 1e-9)
  last = math.ceil(hi / step - 1e-9)
  return [round(i * step, 12) for i in range(first, last + 1)]


def log_ticks(lo: float, hi: float) -> List[float]:
  """log10 of round values (1, 2 and 5 times a power of ten; powers of ten only over more than two
  decades) covering [10**lo, 10**hi], from the largest at or below it to the smallest above."""
  multiples = (1,) if hi - lo > 2 else (1, 2, 5)
  marks = [math.log10(m) + e for e in range(math.floor(lo) - 1, math.ceil(hi) + 2)
           for m in multiples]
  first = max(t for t in marks if t <= lo + 1e-9)
  last = min(t for t in marks if t >= hi - 1e-9)
  if last <= first:
    last = min(t for t in marks if t > first)
  return [t for t in marks if first - 1e-9 <= t <= last + 1e-9]


def _finite(series: Series, log: bool) -> List[Tuple[float, float]]:
  return [(s, v) for s, v in zip(series.steps, series.values)
          if v is not None and math.isfinite(v) and (v > 0 or not log)]


def layout(series: Sequence[Series], box: Tuple[int, int, int, int], log: bool) -> Panel:
  """The panel's ranges and ticks: the steps and values of `series` (non-finite values, and
  non-positive ones on a log scale, left out), widened to round ticks."""
  points = [p for s in series for p in _finite(s, log)]
  steps = [p[0] for p in points] or [0.0, 1.0]
  values = [math.log10(p[1]) if log else p[1] for p in points] or [0.0, 1.0]
  x_ticks = nice_ticks(min(steps), max(steps), integer=True)
  if log:
    y_ticks = log_ticks(min(values), max(values))
  else:
    y_ticks = nice_ticks(min(values), max(values))
  return Panel(box, (x_ticks[0], x_ticks[-1]), (y_ticks[0], y_ticks[-1]), log, x_ticks, y_ticks)


def _label(value: float, log: bool) -> str:
  return f'{10.0 ** value:.3g}' if log else f'{value:.7g}'


def _draw_panel(draw, font, panel: Panel, series: Sequence[Series], xlabel: str, ylabel: str):
  k = _SCALE
  x0, y0, x1, y1 = (c * k for c in panel.box)
  for t in panel.x_ticks:
    x = panel.x_pixel(t)
    draw.line([(x * k, y0), (x * k, y1)], fill=_GRID, width=k)
    draw.text((x * k, y1 + 6 * k), _label(t, False), fill=_TEXT, font=font, anchor='mt')
  for t in panel.y_ticks:
    y = panel.y_pixel(t)
    draw.line([(x0, y * k), (x1, y * k)], fill=_GRID, width=k)
    draw.text((x0 - 6 * k, y * k), _label(t, panel.log), fill=_TEXT, font=font, anchor='rm')
  draw.rectangle([x0, y0, x1, y1], outline=_AXES, width=k)
  draw.text(((x0 + x1) / 2, y1 + 22 * k), xlabel, fill=_TEXT, font=font, anchor='mt')
  draw.text(((x0 + x1) / 2, y0 - 8 * k), ylabel, fill=_TEXT, font=font, anchor='mb')
  for s in series:
    points = [(x * k, y * k) for x, y in (panel.to_pixel(*p) for p in _finite(s, panel.log))]
    if len(points) > 1:
      draw.line(points, fill=s.color, width=2 * k, joint='curve')
    if s.markers or len(points) == 1:
      for x, y in points:
        draw.ellipse([x - 3 * k, y - 3 * k, x + 3 * k, y + 3 * k], fill=s.color)
  if series:
    lx0, ly0, lx1, ly1 = (c * k for c in legend_box(panel, series))
    draw.rectangle([lx0, ly0, lx1, ly1], fill='white', outline=_GRID, width=k)
    for i, s in enumerate(series):
      y = ly0 + (_LEGEND_ROW * i + _LEGEND_ROW / 2 + 3) * k
      draw.line([(lx0 + 8 * k, y), (lx0 + 30 * k, y)], fill=s.color, width=2 * k)
      draw.text((lx0 + 36 * k, y), s.label, fill=_TEXT, font=font, anchor='lm')


_LEGEND_WIDTH, _LEGEND_ROW = 118, 17


def legend_box(panel: Panel, series: Sequence[Series]) -> Tuple[int, int, int, int]:
  """The legend's box: the corner of the plot area that covers the fewest points of the curves
  (sampled along each line), top right on a tie."""
  x0, y0, x1, y1 = panel.box
  w, h = _LEGEND_WIDTH, _LEGEND_ROW * len(series) + 6
  corners = [(x1 - 8 - w, y0 + 8), (x1 - 8 - w, y1 - 8 - h), (x0 + 8, y0 + 8), (x0 + 8, y1 - 8 - h)]
  samples = []
  for s in series:
    points = [panel.to_pixel(*p) for p in _finite(s, panel.log)]
    samples += points
    for (xa, ya), (xb, yb) in zip(points, points[1:]):
      samples += [(xa + (xb - xa) * t / 8, ya + (yb - ya) * t / 8) for t in range(1, 8)]

  def covered(corner):
    cx, cy = corner
    return sum(cx <= x <= cx + w and cy <= y <= cy + h for x, y in samples)

  cx, cy = min(corners, key=covered)  # min keeps the first of equals
  return cx, cy, cx + w, cy + h


def panels(records: Sequence[dict]) -> List[Tuple[Panel, List[Series], str, str]]:
  """The two panels of a run's metric records: (geometry, series, x label, y label)."""
  train = [r for r in records if r['split'] == 'train']
  evals = [r for r in records if r['split'] == 'eval']

  def series(rows, key, label, color, markers=False) -> Optional[Series]:
    if not rows:
      return None
    return Series(label, [r['step'] for r in rows], [r.get(key) for r in rows], color, markers)

  half = WIDTH // 2
  left, top, right, bottom = _MARGIN
  out = []
  for i, (log, ylabel, chosen) in enumerate((
      (True, 'loss (log scale)', [series(train, 'loss', 'train loss', BLUE),
                      series(evals, 'loss', 'eval loss', ORANGE, True)]),
      (False, 'top-1 accuracy', [series(evals, 'accuracy', 'eval top-1', BLUE, True),
                                 series(train, 'accuracy', 'train top-1', _light(ORANGE))]))):
    chosen = [s for s in chosen if s is not None]
    box = (i * half + left, top, (i + 1) * half - right, HEIGHT - bottom)
    out.append((layout(chosen, box, log), chosen, 'step', ylabel))
  return out


def _light(color: Tuple[int, int, int]) -> Tuple[int, int, int]:
  return tuple(int(c + (255 - c) / 2) for c in color)  # half-way to white


def render(records: Sequence[dict]):
  """The learning curve of `records` (a run's metrics.jsonl) as a PIL image, WIDTH x HEIGHT."""
  from PIL import Image, ImageDraw, ImageFont  # pylint: disable=g-import-not-at-top
  image = Image.new('RGB', (WIDTH * _SCALE, HEIGHT * _SCALE), 'white')
  draw = ImageDraw.Draw(image)
  font = ImageFont.load_default(size=11 * _SCALE)
  for panel, series, xlabel, ylabel in panels(records):
    _draw_panel(draw, font, panel, series, xlabel, ylabel)
  return image.resize((WIDTH, HEIGHT), Image.Resampling.LANCZOS)
