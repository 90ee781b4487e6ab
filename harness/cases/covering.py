"""Greedy covering arrays: few rows such that every value pair of every two axes (and every value tuple of chosen
larger axis groups) appears in some row.

Deterministic: the same axes give the same rows (no randomness, ties broken by value order).
"""

from __future__ import annotations

from itertools import combinations, product
from typing import Any, Callable, Mapping, Sequence

Row = dict[str, Any]


def covering_rows(
    axes: Mapping[str, Sequence[Any]],
    groups: Sequence[tuple[str, ...]] = (),
    valid: Callable[[Row], bool] = lambda row: True,
) -> list[Row]:
    """Rows covering all pairs of ``axes`` plus every full combination of each axis tuple in ``groups``.

    ``valid(partial_row)`` must return False only for assignments that are already impossible (it sees partial
    rows); combinations that are never valid are not required. Raises ValueError on a dead end.
    """
    names = list(axes)
    interactions = [tuple(pair) for pair in combinations(names, 2)] + [tuple(g) for g in groups]
    uncovered: list[tuple[tuple[str, ...], tuple]] = []
    for group in interactions:
        for values in product(*(axes[a] for a in group)):
            target = dict(zip(group, values, strict=True))
            if valid(target):
                uncovered.append((group, values))
    remaining = set(range(len(uncovered)))
    by_axis: dict[str, list[int]] = {name: [] for name in names}
    for i, (group, _) in enumerate(uncovered):
        for a in group:
            by_axis[a].append(i)

    def gain(row: Row, name: str) -> int:
        """Targets newly covered by the value just given to ``name`` (all their axes assigned)."""
        return sum(1 for i in by_axis[name] if i in remaining and _covers(row, *uncovered[i]))

    rows: list[Row] = []
    while remaining:
        group, values = uncovered[min(remaining)]
        row: Row = dict(zip(group, values, strict=True))
        for name in names:
            if name in row:
                continue
            best, best_gain = None, -1
            for value in axes[name]:
                trial = {**row, name: value}
                if not valid(trial):
                    continue
                g = gain(trial, name)
                if g > best_gain:
                    best, best_gain = value, g
            if best_gain < 0:
                raise ValueError(f"covering_rows: no valid value for axis {name!r} given {row}")
            row[name] = best
        newly = {i for i in remaining if _covers(row, *uncovered[i])}
        if not newly:
            raise ValueError(f"covering_rows: row {row} covers nothing new")
        remaining -= newly
        rows.append({name: row[name] for name in names})
    return rows


def _covers(row: Row, group: tuple[str, ...], values: tuple) -> bool:
    return all(a in row and row[a] == v for a, v in zip(group, values, strict=True))


def uncovered_targets(
    rows: Sequence[Row], axes: Mapping[str, Sequence[Any]], groups: Sequence[tuple[str, ...]] = (),
    valid: Callable[[Row], bool] = lambda row: True,
) -> list[Row]:
    """The valid pair/group assignments no row covers (empty when ``rows`` is a covering array)."""
    interactions = [tuple(pair) for pair in combinations(list(axes), 2)] + [tuple(g) for g in groups]
    missing = []
    for group in interactions:
        for values in product(*(axes[a] for a in group)):
            target = dict(zip(group, values, strict=True))
            if valid(target) and not any(_covers(r, group, values) for r in rows):
                missing.append(target)
    return missing
