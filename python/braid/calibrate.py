"""``braid calibrate``: fit the planner's cost coefficients from measured step times.

The planner balances on cost(L) = attn*L^2 + linear*L per document piece (docs/planner.md).
Given timings of micro-batches (or steps) whose documents' lengths are known, this fits

    step_time_s ~= attn * sum(l^2) + linear * sum(l) [+ intercept]

by least squares and writes a copy of the config with balance.cost.attn / .linear replaced
(every other key kept). The intercept (fixed per-step overhead) is reported, not written:
it is the same for every rank and does not change the balance.

CSV format: a header row, then one row per measurement. Columns (any order, extra columns
ignored): ``step_time_s`` and either ``seq_lens`` (the documents' lengths, separated by
spaces or ';') or both ``sum_l2`` and ``sum_l``. Fitting is arithmetic on measurements
only; nothing here runs during training.
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

try:  # PyYAML: YAML in and out; without it, JSON configs only
    import yaml
except ImportError:  # pragma: no cover - .venv has PyYAML
    yaml = None


class CalibrateError(ValueError):
    """Bad timings or config; the message names the file and line (or key)."""


@dataclass
class Fit:
    attn: float
    linear: float
    intercept: float  # 0.0 when fitted without one
    r2: float
    rows: int


def read_timings(path: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns (sum_l2, sum_l, step_time_s) arrays, one entry per CSV row."""
    try:
        with open(path, newline="") as f:
            lines = list(csv.reader(f))
    except OSError as e:
        raise CalibrateError(f"{path}: {e.strerror or e}") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise CalibrateError(f"{path}: not a CSV file: {e}") from None
    # Line numbers are 1-based and count blank lines, as an editor shows them.
    numbered = [(i + 1, row) for i, row in enumerate(lines) if any(c.strip() for c in row)]
    if not numbered:
        raise CalibrateError(f"{path}: empty; expected a header and rows")
    header_line, header = numbered[0]
    cols = {name.strip(): k for k, name in enumerate(header)}
    if "step_time_s" not in cols:
        raise CalibrateError(f"{path}:{header_line}: header has no 'step_time_s' column")
    use_lens = "seq_lens" in cols
    if not use_lens and not ("sum_l2" in cols and "sum_l" in cols):
        raise CalibrateError(f"{path}:{header_line}: header needs 'seq_lens' or both "
                             "'sum_l2' and 'sum_l' columns")
    s2: List[float] = []
    s1: List[float] = []
    t: List[float] = []
    for line, row in numbered[1:]:
        def cell(name: str) -> str:
            k = cols[name]
            if k >= len(row):
                raise CalibrateError(f"{path}:{line}: missing column '{name}'")
            return row[k].strip()

        def number(name: str, text: str) -> float:
            try:
                v = float(text)
            except ValueError:
                raise CalibrateError(f"{path}:{line}: '{name}' is not a number: "
                                     f"{text!r}") from None
            if not np.isfinite(v) or v < 0:
                raise CalibrateError(f"{path}:{line}: '{name}' must be finite and >= 0, "
                                     f"got {text!r}")
            return v

        time = number("step_time_s", cell("step_time_s"))
        if use_lens:
            parts = [p for p in re.split(r"[;\s]+", cell("seq_lens")) if p]
            if not parts:
                raise CalibrateError(f"{path}:{line}: 'seq_lens' is empty")
            lens = []
            for p in parts:
                try:
                    n = int(p)
                except ValueError:
                    raise CalibrateError(f"{path}:{line}: 'seq_lens' holds a non-integer "
                                         f"length: {p!r}") from None
                if n <= 0:
                    raise CalibrateError(f"{path}:{line}: 'seq_lens' lengths must be > 0, "
                                         f"got {n}")
                lens.append(float(n))
            arr = np.asarray(lens)
            s2.append(float(np.sum(arr * arr)))
            s1.append(float(np.sum(arr)))
        else:
            s2.append(number("sum_l2", cell("sum_l2")))
            s1.append(number("sum_l", cell("sum_l")))
        t.append(time)
    if not t:
        raise CalibrateError(f"{path}: no rows after the header (line {header_line})")
    return np.asarray(s2), np.asarray(s1), np.asarray(t)


def fit(sum_l2: np.ndarray, sum_l: np.ndarray, times: np.ndarray,
        intercept: bool = True) -> Fit:
    """Least squares fit of times ~ attn*sum_l2 + linear*sum_l (+ intercept)."""
    columns = [sum_l2, sum_l] + ([np.ones_like(times)] if intercept else [])
    a = np.stack(columns, axis=1)
    if len(times) < a.shape[1]:
        raise CalibrateError(f"{len(times)} measurements cannot fit {a.shape[1]} "
                             "coefficients; measure more micro-batches")
    # Scale columns to unit norm so that sum_l2 (~1e8) and sum_l (~1e4) condition well.
    norms = np.linalg.norm(a, axis=0)
    if np.any(norms == 0):
        raise CalibrateError("a column of the timings is all zero; cannot fit")
    coef, _, rank, _ = np.linalg.lstsq(a / norms, times, rcond=None)
    if rank < a.shape[1]:
        raise CalibrateError("the timings do not determine the coefficients (sum_l2 and "
                             "sum_l are proportional); measure a spread of lengths")
    coef = coef / norms
    pred = a @ coef
    ss_res = float(np.sum((times - pred) ** 2))
    ss_tot = float(np.sum((times - np.mean(times)) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return Fit(attn=float(coef[0]), linear=float(coef[1]),
               intercept=float(coef[2]) if intercept else 0.0, r2=r2, rows=len(times))


def load_config_doc(path: str) -> Any:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise CalibrateError(f"{path}: {e.strerror or e}") from None
    try:
        doc = yaml.safe_load(text) if yaml is not None else json.loads(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError
        raise CalibrateError(f"{path}: not a valid config file: {e}") from None
    if not isinstance(doc, dict):
        raise CalibrateError(f"{path}: the config must be a mapping")
    return doc


def _copied_mapping(parent: dict, key: str, where: str) -> dict:
    """A copy of parent[key] (a new dict when absent), stored back into `parent`."""
    value = parent.get(key)
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise CalibrateError(f"{where}: must be a mapping")
    parent[key] = dict(value)
    return parent[key]


def with_costs(doc: dict, attn: float, linear: float, where: str = "config") -> dict:
    """A copy of `doc` with balance.cost.attn / linear set; other keys kept in order."""
    out = dict(doc)
    balance = _copied_mapping(out, "balance", f"{where}: balance")
    cost = _copied_mapping(balance, "cost", f"{where}: balance.cost")
    cost["attn"] = attn
    cost["linear"] = linear
    return out


def dump_config(doc: dict, path: str) -> str:
    """Writes `doc` as YAML (JSON when the name ends in .json or PyYAML is missing)."""
    as_json = yaml is None or path.lower().endswith(".json")
    text = (json.dumps(doc, indent=2) + "\n" if as_json
            else yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))
    with open(path, "w") as f:
        f.write(text)
    return "json" if as_json else "yaml"


def calibrate(timings: str, config: str, out: str, intercept: bool = True) -> Fit:
    s2, s1, t = read_timings(timings)
    result = fit(s2, s1, t, intercept=intercept)
    if result.attn < 0 or result.linear < 0:
        raise CalibrateError(
            f"{timings}: the fit gives a negative coefficient (attn={result.attn:.6g}, "
            f"linear={result.linear:.6g}); the planner needs both >= 0. Measure a wider "
            "spread of lengths, or fit without an intercept (--no-intercept)")
    doc = load_config_doc(config)
    new = with_costs(doc, result.attn, result.linear, where=config)
    if os.path.abspath(out) == os.path.abspath(config):
        raise CalibrateError(f"--out {out}: would overwrite the input config")
    dump_config(new, out)
    return result


def format_fit(f: Fit, intercept: bool = True) -> str:
    lines = [f"rows:      {f.rows}",
             f"attn:      {f.attn:.6g}   (seconds per token^2)",
             f"linear:    {f.linear:.6g}   (seconds per token)"]
    if intercept:
        lines.append(f"intercept: {f.intercept:.6g} s   (reported, not written)")
    lines.append(f"R^2:       {f.r2:.6f}")
    return "\n".join(lines)
