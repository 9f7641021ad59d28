"""`braid calibrate`: least-squares fit of balance.cost.attn/linear from step timings."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from braid import calibrate
from conftest import braid_cli

ATTN, LINEAR, INTERCEPT = 2.5e-10, 3.0e-6, 0.04

CONFIG_YAML = """\
seed: 7
topology: {dp: 2}
batch: {global_tokens: 4096, seq_len: 1024, micro_batch_size: 1}
balance:
  cost: {attn: 1.0, linear: 0.0, vision: 0.5}
  algorithm: greedy
sources:
  - {name: web, path: data/web, weight: 0.7}
  - {name: code, path: data/code, weight: 0.3}
"""


def synthetic_rows(n=60, seed=0, noise=0.0, intercept=INTERCEPT):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        lens = rng.integers(16, 4096, size=rng.integers(1, 9))
        t = ATTN * float(np.sum(lens.astype(float) ** 2)) + LINEAR * float(np.sum(lens))
        t += intercept
        t *= 1.0 + noise * rng.standard_normal()
        rows.append((t, [int(x) for x in lens]))
    return rows


def write_seq_lens_csv(path, rows, sep=" "):
    lines = ["step,step_time_s,seq_lens"]
    for i, (t, lens) in enumerate(rows):
        lines.append(f"{i},{t!r},{sep.join(map(str, lens))}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def config_path(tmp_path):
    p = tmp_path / "job.yaml"
    p.write_text(CONFIG_YAML)
    return p


@pytest.mark.parametrize("sep", [" ", ";"])
def test_recovers_known_coefficients_from_seq_lens(tmp_path, config_path, sep):
    csv = write_seq_lens_csv(tmp_path / "t.csv", synthetic_rows(n=300, noise=0.001), sep)
    out = tmp_path / "new.yaml"
    fit = calibrate.calibrate(str(csv), str(config_path), str(out))
    assert fit.attn == pytest.approx(ATTN, rel=0.01)
    assert fit.linear == pytest.approx(LINEAR, rel=0.01)
    assert fit.intercept == pytest.approx(INTERCEPT, rel=0.05)
    assert fit.r2 > 0.99
    new = yaml.safe_load(out.read_text())
    old = yaml.safe_load(config_path.read_text())
    assert new["balance"]["cost"]["attn"] == pytest.approx(fit.attn, rel=1e-12)
    assert new["balance"]["cost"]["linear"] == pytest.approx(fit.linear, rel=1e-12)
    # Everything else kept, in order; the intercept is not written.
    assert new["balance"]["cost"]["vision"] == 0.5
    assert list(new) == list(old)
    for key in old:
        if key != "balance":
            assert new[key] == old[key]
    assert new["balance"]["algorithm"] == "greedy"
    assert "intercept" not in json.dumps(new)


def test_exact_fit_without_intercept_from_sums(tmp_path, config_path):
    rows = synthetic_rows(n=20, seed=3, intercept=0.0)
    lines = ["sum_l2,sum_l,step_time_s"]
    for t, lens in rows:
        a = np.asarray(lens, dtype=float)
        lines.append(f"{float(np.sum(a * a))!r},{float(np.sum(a))!r},{t!r}")
    csv = tmp_path / "sums.csv"
    csv.write_text("\n".join(lines) + "\n")
    s2, s1, t = calibrate.read_timings(str(csv))
    fit = calibrate.fit(s2, s1, t, intercept=False)
    assert fit.attn == pytest.approx(ATTN, rel=1e-6)
    assert fit.linear == pytest.approx(LINEAR, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_cli_prints_fit_and_writes_config(tmp_path, config_path):
    csv = write_seq_lens_csv(tmp_path / "t.csv", synthetic_rows())
    out = tmp_path / "new.yaml"
    result = braid_cli("calibrate", csv, config_path, "--out", out)
    assert result.returncode == 0, result.stderr
    assert "attn:" in result.stdout and "R^2:" in result.stdout
    assert "intercept:" in result.stdout
    cost = yaml.safe_load(out.read_text())["balance"]["cost"]
    assert cost["attn"] == pytest.approx(ATTN, rel=0.01)
    assert cost["linear"] == pytest.approx(LINEAR, rel=0.01)


def test_cli_json_out(tmp_path, config_path):
    csv = write_seq_lens_csv(tmp_path / "t.csv", synthetic_rows(intercept=0.0))
    out = tmp_path / "new.json"
    result = braid_cli("calibrate", csv, config_path, "--out", out, "--no-intercept")
    assert result.returncode == 0, result.stderr
    assert "intercept" not in result.stdout
    doc = json.loads(out.read_text())
    assert doc["sources"][0]["name"] == "web" and doc["balance"]["cost"]["attn"] > 0


@pytest.mark.parametrize("body, message", [
    ("step_time_s,seq_lens\n0.1,100 200\n0.2,abc\n", ":3: 'seq_lens' holds a non-integer"),
    ("step_time_s,seq_lens\n0.1,100 200\nfast,300\n", ":3: 'step_time_s' is not a number"),
    ("step_time_s,seq_lens\n0.1,100\n\n-1,300\n", ":4: 'step_time_s' must be finite"),
    ("step_time_s,seq_lens\n0.1,100\n0.3\n", ":3: missing column 'seq_lens'"),
    ("step_time_s,seq_lens\n0.1,0 5\n", ":2: 'seq_lens' lengths must be > 0"),
    ("step_time_s,seq_lens\n0.1,\n", ":2: 'seq_lens' is empty"),
    ("time,seq_lens\n0.1,100\n", ":1: header has no 'step_time_s'"),
    ("step_time_s,sum_l2\n0.1,100\n", ":1: header needs 'seq_lens' or both"),
    ("step_time_s,seq_lens\n", "no rows after the header"),
    ("", "empty"),
    ("step_time_s,seq_lens\n0.1,100\n0.2,200\n", "cannot fit 3 coefficients"),
])
def test_bad_csv_exits_2_naming_the_line(tmp_path, config_path, body, message):
    csv = tmp_path / "bad.csv"
    csv.write_text(body)
    out = tmp_path / "new.yaml"
    result = braid_cli("calibrate", csv, config_path, "--out", out)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr, result.stderr
    assert str(csv) in result.stderr or message == "cannot fit 3 coefficients"
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_degenerate_lengths_and_missing_files(tmp_path, config_path):
    # Every micro-batch one document of the same length: sum_l2 proportional to sum_l.
    csv = tmp_path / "same.csv"
    csv.write_text("step_time_s,seq_lens\n" + "".join(f"{0.1 * k},{'512 ' * k}\n"
                                                      for k in range(1, 6)))
    result = braid_cli("calibrate", csv, config_path, "--out", tmp_path / "o.yaml",
                       "--no-intercept")
    assert result.returncode == 2 and "do not determine" in result.stderr
    result = braid_cli("calibrate", tmp_path / "nope.csv", config_path, "--out",
                       tmp_path / "o.yaml")
    assert result.returncode == 2 and "nope.csv" in result.stderr
    good = write_seq_lens_csv(tmp_path / "t.csv", synthetic_rows())
    result = braid_cli("calibrate", good, tmp_path / "nope.yaml", "--out",
                       tmp_path / "o.yaml")
    assert result.returncode == 2 and "nope.yaml" in result.stderr
