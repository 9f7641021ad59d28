"""Signals and pipes: Ctrl-C (SIGINT) and a launcher's SIGTERM stop `braid run`, `braid
plan` and a trainer blocked in next() on braid.Loader promptly and cleanly; a closed
stdout ends `braid plan` quietly.

Each case runs a fresh process as a user would. The sources go through a Python transform
that sleeps, so the process spends its time inside the C++ engine (the state in which a
signal is hardest to honour). Every wait has a deadline: a process that does not stop in
time is killed and the test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import write_config

DEADLINE_S = 15.0  # to see the first step (start-up included)
STOP_S = 5.0  # from the signal to the exit

SLOW_MODULE = textwrap.dedent("""
    import time

    def slow(ids):
        time.sleep(0.01)  # the loader thread waits; the trainer blocks in next()
        return ids
""")

LOADER_SCRIPT = textwrap.dedent("""
    import sys
    import braid

    loader = braid.Loader(sys.argv[1], rank=0, world_size=2)
    it = iter(loader)
    next(it)
    try:  # the SIGINT may land as soon as "ready" is written, inside print()
        print("ready", flush=True)
        while True:
            next(it)
    except KeyboardInterrupt:
        loader.close()
        print("interrupted after", loader.state_dict()["step"], file=sys.stderr)
        sys.exit(130)
""")


@pytest.fixture
def slow_job(small_dataset, tmp_path: Path):
    """A config whose rows pass through a sleeping transform, and the env to run it."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "braid_slow_tx.py").write_text(SLOW_MODULE)
    config = dict(small_dataset["config"])
    config["sources"] = [
        {**{k: v for k, v in s.items() if k != "tokens_column"},
         "transform": {"python": "braid_slow_tx:slow", "columns": ["input_ids"]}}
        for s in config["sources"]]
    path = write_config(tmp_path / "slow.yaml", config)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")]))
    return {"config": path, "env": env, "dir": tmp_path}


def default_signals() -> None:
    """In the child before exec: SIGINT and SIGTERM as a shell's foreground job has them.
    A suite started from a shell that ignores SIGINT (`nohup`, a background job) passes
    that on, and a Python that starts with SIGINT ignored never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start(args, env, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *map(str, args)], preexec_fn=default_signals,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)


def wait_for_line(proc: subprocess.Popen, prefix: str) -> None:
    """Reads stdout until a line starts with `prefix`; the deadline kills the process."""
    deadline = time.monotonic() + DEADLINE_S
    watchdog = threading.Timer(DEADLINE_S, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            if line.startswith(prefix):
                return
        pytest.fail(f"no line starting {prefix!r}; exit {proc.wait()}, "
                    f"stderr: {proc.stderr.read()}")
    finally:
        watchdog.cancel()
        assert time.monotonic() < deadline, "the process was killed by the deadline"


def stop_with(proc: subprocess.Popen, sig: int):
    """Sends `sig`; returns (exit status, stderr, seconds to exit)."""
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"still running {STOP_S} s after signal {sig}")
    return proc.returncode, err, time.monotonic() - t0


@pytest.mark.parametrize("sig, status, message", [
    (signal.SIGINT, 130, "braid: interrupted"),
    (signal.SIGTERM, 143, "braid: terminated (SIGTERM)"),
])
def test_braid_run_stops_promptly_on_a_signal(slow_job, sig, status, message):
    proc = start(["-m", "braid.cli", "run", slow_job["config"], "--steps", 10**7],
                 slow_job["env"], slow_job["dir"])
    wait_for_line(proc, "step      1/")
    code, err, seconds = stop_with(proc, sig)
    assert code == status, err
    assert err.strip().splitlines() == [message], err
    assert seconds < STOP_S


@pytest.mark.parametrize("sig, status, message", [
    (signal.SIGINT, 130, "braid: interrupted"),
    (signal.SIGTERM, 143, "braid: terminated (SIGTERM)"),
])
def test_braid_plan_stops_promptly_on_a_signal(slow_job, sig, status, message):
    proc = start(["-m", "braid.cli", "plan", slow_job["config"], "--steps", 10**7],
                 slow_job["env"], slow_job["dir"])
    wait_for_line(proc, '{"step":0,')
    code, err, _ = stop_with(proc, sig)
    assert code == status, err
    assert err.strip().splitlines() == [message], err


def test_loader_trainer_stops_on_ctrl_c(slow_job):
    script = slow_job["dir"] / "train.py"
    script.write_text(LOADER_SCRIPT)
    proc = start([script, slow_job["config"]], slow_job["env"], slow_job["dir"])
    wait_for_line(proc, "ready")
    code, err, _ = stop_with(proc, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err and "interrupted after" in err, err


def test_loader_trainer_stops_cleanly_on_sigterm(slow_job):
    script = slow_job["dir"] / "train.py"
    script.write_text(LOADER_SCRIPT)
    proc = start([script, slow_job["config"]], slow_job["env"], slow_job["dir"])
    wait_for_line(proc, "ready")
    code, err, _ = stop_with(proc, signal.SIGTERM)
    assert code == 143, err
    assert err.strip().splitlines() == [
        "braid: SIGTERM: loader threads stopped; exiting with status 143"], err


def test_loader_leaves_a_program_s_own_sigterm_handler_alone(slow_job):
    script = slow_job["dir"] / "train.py"
    script.write_text(textwrap.dedent("""
        import signal, sys
        import braid

        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        loader = braid.Loader(sys.argv[1], rank=0, world_size=2)
        it = iter(loader)
        next(it)
        print("ready", flush=True)
        while not stop:
            next(it)
        loader.close()
        print("own handler", file=sys.stderr)
    """))
    proc = start([script, slow_job["config"]], slow_job["env"], slow_job["dir"])
    wait_for_line(proc, "ready")
    code, err, _ = stop_with(proc, signal.SIGTERM)
    assert code == 0 and err.strip() == "own handler", err


HUNG_MODULE = textwrap.dedent("""
    import time

    def hung(ids):
        if len(ids) % 7 == 3:
            time.sleep(5)  # a read that hangs: the trainer waits in next() meanwhile
        return ids
""")

HUNG_SCRIPT = textwrap.dedent("""
    import sys, time
    import braid

    loader = braid.Loader(sys.argv[1], rank=0, world_size=2)
    it = iter(loader)
    print("ready", flush=True)
    step = 0
    try:
        while True:
            next(it)
            step += 1
    except KeyboardInterrupt:
        raised = time.monotonic()
        print(f"interrupted {raised:.3f} {step} {loader.state_dict()['step']}", flush=True)
        loader.close()
        sys.exit(130)
""")


@pytest.fixture
def hung_job(slow_job):
    (slow_job["dir"] / "mods" / "braid_hung_tx.py").write_text(HUNG_MODULE)
    config = yaml.safe_load(Path(slow_job["config"]).read_text())
    for s in config["sources"]:
        s["transform"]["python"] = "braid_hung_tx:hung"
    config.setdefault("runtime", {})["prefetch_steps"] = 1
    path = write_config(slow_job["dir"] / "hung.yaml", config)
    return {**slow_job, "config": path}


def test_ctrl_c_interrupts_a_next_that_waits_on_a_hung_read(hung_job):
    """A row whose read takes 5 s holds up next(); Ctrl-C raises KeyboardInterrupt in
    the trainer within a second all the same (the stream does not move:
    EngineTest.AnInterruptedNextLeavesTheStreamWhereItWas)."""
    script = hung_job["dir"] / "hung.py"
    script.write_text(HUNG_SCRIPT)
    proc = start([script, hung_job["config"]], hung_job["env"], hung_job["dir"])
    wait_for_line(proc, "ready")
    time.sleep(2.0)  # well inside a 5 s read
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("still running 30 s after Ctrl-C")
    assert proc.returncode == 130, err[-2000:]
    words = out.split()
    assert words[0] == "interrupted", out + err[-2000:]
    assert float(words[1]) - sent < 1.0, float(words[1]) - sent
    assert "Traceback" not in err, err[-2000:]


def test_close_from_other_threads_while_next_waits_ends_the_iterator(slow_job):
    """close() from several threads at once while the trainer's thread waits in next():
    every close returns, the waiting next() ends the iterator (no error, no crash), and
    the state is the position after the last batch that thread took."""
    script = slow_job["dir"] / "close.py"
    script.write_text(textwrap.dedent("""
        import sys, threading, time
        import braid

        loader = braid.Loader(sys.argv[1], rank=0, world_size=2)
        it = iter(loader)
        next(it)
        taken, errors = [1], []

        def consume():
            try:
                for _ in it:
                    taken[0] += 1
            except BaseException as e:  # noqa: BLE001 - reported to the test
                errors.append(repr(e))

        consumer = threading.Thread(target=consume)
        consumer.start()
        time.sleep(0.3)  # the consumer is inside next(), the transform sleeping
        closers = [threading.Thread(target=loader.close) for _ in range(4)]
        for c in closers:
            c.start()
        for c in closers:
            c.join(10)
        consumer.join(10)
        alive = consumer.is_alive() or any(c.is_alive() for c in closers)
        print("alive" if alive else "done", errors, taken[0], loader.state_dict()["step"] >= 0,
              flush=True)
    """))
    result = subprocess.run([sys.executable, str(script), str(slow_job["config"])],
                            capture_output=True, text=True, env=slow_job["env"],
                            cwd=slow_job["dir"], timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    words = result.stdout.split()
    assert words[0] == "done" and words[1] == "[]", result.stdout + result.stderr[-2000:]
    assert int(words[2]) >= 1 and words[3] == "True"


@pytest.mark.parametrize("reader", ["head -c 100", "head -n 1", "true"])
def test_plan_into_a_closed_pipe_ends_quietly(small_dataset, tmp_path, reader):
    config = write_config(tmp_path / "job.yaml", small_dataset["config"])
    cmd = (f"'{sys.executable}' -m braid.cli plan '{config}' --steps 500; "
           "echo \"status $?\" >&2")
    result = subprocess.run(["bash", "-c", f"set -o pipefail; ( {cmd} ) | {reader}"],
                            capture_output=True, text=True, timeout=60)
    err = result.stderr.strip().splitlines()
    # 141 = 128 + SIGPIPE, as for any tool whose reader went away; 0 if all fitted.
    assert err in (["status 141"], ["status 0"]), result.stderr
    if reader == "head -c 100":
        assert len(result.stdout) == 100 and err == ["status 141"]
