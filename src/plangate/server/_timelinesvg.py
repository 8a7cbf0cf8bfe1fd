"""The timeline drawn as inline SVG: lanes, bars, markers and the broken axis.

Colours come from classes in the stylesheet (the CSP allows no inline style); every bar and
marker carries a glyph or words and a ``<title>`` (who did what, shown on hover and read out
by screen readers), so colour is never the only sign, and nothing needs a script.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from html import escape

from plangate.server._timeline import POINT, STATES, Bar, Lane, Marker, Timeline, span

LEFT = 200.0  # the lane titles
PAD = 18.0  # between the titles and the first moment
RIGHT = 96.0  # room for the last bar's words
TOP = 52.0  # the axis
LANE = 40.0
STACK = 18.0  # a marker that would overlap the one before it on its lane moves down this much
BAR_H = 16.0
_ZIG = "l3,-5 l3,10 l3,-10 l3,5"  # the sign of a broken axis


def clock(moment: datetime) -> str:
    return moment.strftime("%d %b %H:%M:%S")


def draw(timeline: Timeline) -> str:
    """The whole timeline as one ``<svg>`` element."""
    rows = {lane.key: _rows(timeline, lane) for lane in timeline.lanes}
    tops, y = {}, TOP
    for lane in timeline.lanes:
        tops[lane.key] = y
        y += LANE + STACK * (rows[lane.key] - 1)
    width, height = LEFT + PAD * 2 + timeline.width + RIGHT, y + 8
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-labelledby="timeline-title">'
        f'<title id="timeline-title">the plan\'s events on one time axis: a lane per step, '
        f"a bar per attempt, a marker per decision</title>"
    ]
    parts += _lanes(timeline, tops, rows, width)
    parts += _axis(timeline, height)
    last = {(bar.lane, bar.undo): bar for bar in timeline.bars}
    for bar in timeline.bars:
        parts.append(_bar(timeline, bar, tops[bar.lane], label=last[(bar.lane, bar.undo)] is bar))
    parts += _markers(timeline, tops)
    parts.append("</svg>")
    return "".join(parts)


def _x(timeline: Timeline, moment: datetime) -> float:
    return LEFT + PAD + timeline.x(moment)


def _rows(timeline: Timeline, lane: Lane) -> int:
    return 1 + max((row for _, row in _stacked(timeline, lane.key)), default=0)


def _stacked(timeline: Timeline, key: str) -> Iterator[tuple[Marker, int]]:
    """The lane's markers, each with its row: a marker too close to the one before it goes a row down."""
    last: dict[int, float] = {}
    for marker in timeline.markers:
        if marker.lane != key:
            continue
        x = timeline.x(marker.at)
        row = next((r for r in range(4) if x - last.get(r, -1e9) >= 19), 3)
        last[row] = x
        yield marker, row


def _lanes(timeline: Timeline, tops: dict[str, float], rows: dict[str, int], width: float) -> list[str]:
    out = []
    for index, lane in enumerate(timeline.lanes):
        y, h = tops[lane.key], LANE + STACK * (rows[lane.key] - 1)
        out.append(
            f'<rect class="lane{" odd" if index % 2 else ""}" x="0" y="{y:.1f}" width="{width:.0f}" height="{h:.1f}"/>'
        )
        title = escape(lane.title if len(lane.title) <= 24 else lane.title[:23] + "…")
        out.append(f'<text class="lane-title" x="10" y="{y + 17:.1f}">{title}</text>')
        if lane.key.startswith(("step-", "action-")):
            out.append(f'<text class="lane-state t-{lane.state}" x="10" y="{y + 32:.1f}">{escape(lane.caption)}</text>')
    return out


def _axis(timeline: Timeline, height: float) -> list[str]:
    """Each stretch's start (clock time, UTC) and length on top; each idle gap a grey band saying how long."""
    out = [
        f'<line class="axis" x1="{LEFT:.0f}" y1="{TOP - 6:.0f}" '
        f'x2="{LEFT + PAD * 2 + timeline.width:.0f}" y2="{TOP - 6:.0f}"/>'
    ]
    for stretch in timeline.stretches:
        x0 = LEFT + PAD + stretch.x
        out.append(f'<text class="tick" x="{x0:.1f}" y="16">{clock(stretch.start)}</text>')
        if stretch.width > POINT:  # a busy stretch: its length; a point's moments are on their markers
            x1 = x0 + stretch.width
            out.append(
                f'<line class="span" x1="{x0:.1f}" y1="{TOP - 14:.0f}" x2="{x1:.1f}" y2="{TOP - 14:.0f}"/>'
                f'<text class="span-label" x="{(x0 + x1) / 2:.1f}" y="{TOP - 19:.0f}">{span(stretch.seconds)}</text>'
            )
    for start, stop, length in timeline.gaps():
        x0, x1 = LEFT + PAD + start, LEFT + PAD + stop
        middle = (x0 + x1) / 2
        out.append(
            f'<g class="gap"><title>nothing ran for {length}</title>'
            f'<rect x="{x0 + 6:.1f}" y="{TOP - 6:.0f}" width="{x1 - x0 - 12:.1f}" height="{height - TOP:.1f}"/>'
            f'<path d="M{x0 + 6:.1f},{TOP - 6:.0f} {_ZIG} M{x1 - 18:.1f},{TOP - 6:.0f} {_ZIG}"/>'
            f'<text x="{middle:.1f}" y="{TOP - 19:.0f}">{escape(length)}</text></g>'
        )
    return out


def _bar(timeline: Timeline, bar: Bar, top: float, *, label: bool) -> str:
    """A bar from start to outcome; the last of a lane says its outcome and length (the others on hover)."""
    x0, x1 = _x(timeline, bar.start), _x(timeline, bar.end)
    width = max(x1 - x0, 4.0)
    y, h = (top + 25, 10.0) if bar.undo else (top + (LANE - BAR_H) / 2, BAR_H)
    classes = f"bar b-{bar.state}" + (" undo" if bar.undo else "") + (" open" if bar.open else "")
    hover = f"{bar.words} (started {clock(bar.start)} UTC)" + (f"\n{bar.who}: {bar.text}" if bar.text else "")
    glyph = STATES[bar.state][0]
    words = f"{glyph} {'' if bar.attempt == 1 or bar.undo else f'#{bar.attempt} '}{span(bar.seconds)}" if label else ""
    return (
        f'<g class="{classes}" tabindex="0"><title>{escape(hover)}</title>'
        f'<rect x="{x0:.1f}" y="{y:.1f}" width="{width:.1f}" height="{h:.0f}" rx="3"/>'
        + (f'<text x="{x0 + width + 5:.1f}" y="{y + h - 3:.1f}">{escape(words)}</text>' if words else "")
        + "</g>"
    )


def _markers(timeline: Timeline, tops: dict[str, float]) -> list[str]:
    out = []
    for lane in timeline.lanes:
        for marker, row in _stacked(timeline, lane.key):
            x, y = _x(timeline, marker.at), tops[lane.key] + LANE / 2 + STACK * row
            hover = f"{clock(marker.at)} UTC ({timeline.offset(marker.at)}) · {marker.who}: {marker.text}"
            out.append(
                f'<g class="mk m-{marker.mark}" tabindex="0"><title>{escape(hover)}</title>'
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8"/>'
                f'<text x="{x:.1f}" y="{y + 3.5:.1f}">{escape(marker.glyph)}</text></g>'
            )
    return out
