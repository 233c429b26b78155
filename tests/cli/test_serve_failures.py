"""``serve``'s failure paths end in one ``error:`` line and exit 2, before the model loads, and leave
no process behind; a compile worker whose parent dies exits quietly (no BrokenPipeError traceback
after the shell prompt is back), whether it was starting or idle."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path


def _env(mark: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DGEMMA_STRUCT_")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", DGEMMA_TEST_MARK=mark, PYTHONFAULTHANDLER="1")
    return env


def _marked(mark: str) -> list[int]:
    """Live processes started under this test's mark (children inherit the environment)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"DGEMMA_TEST_MARK={mark}".encode() in environ.split(b"\0") and state != "Z":
            pids.append(int(proc.name))
    return pids


def _none_left(mark: str, wait_s: float = 20.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _serve(args: list[str], mark: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgemma_struct.cli", "serve", *args], capture_output=True,
                          text=True, timeout=300, env=_env(mark))


def _one_line_exit_2(proc: subprocess.CompletedProcess, needle: str) -> None:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr[-2000:]


def test_busy_port_is_one_line_before_loading_and_leaves_nothing():
    mark = uuid.uuid4().hex
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve(["--port", str(port), "--device", "cpu"], mark)
    _one_line_exit_2(proc, f"cannot listen on 127.0.0.1:{port}")
    assert proc.stdout == ""
    assert _none_left(mark) == []


def test_bad_model_dir_fails_before_the_port_check(tmp_path):
    mark = uuid.uuid4().hex
    with socket.socket() as busy:   # the model error wins: it names the real problem
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = _serve(["--port", str(busy.getsockname()[1]), "--model", str(tmp_path / "nope")], mark)
    _one_line_exit_2(proc, "is not one")
    assert _none_left(mark) == []


def test_an_empty_model_dir_is_one_line(tmp_path):
    mark = uuid.uuid4().hex
    proc = _serve(["--port", "0", "--model", str(tmp_path), "--device", "cpu"], mark)
    _one_line_exit_2(proc, "cannot load a config")
    assert _none_left(mark) == []


# A parent that starts compile workers and then dies: while a worker is still starting (its "ready"
# meets a closed socket) and after it is idle (nothing to read, the parent pid changes).
_PARENT = textwrap.dedent("""
    import os, sys, threading, time
    from dgemma_struct.constraints.compile_pool import CompilePool
    pool = CompilePool(size=1, memory_mb=None)
    if sys.argv[1] == "idle":
        pool.warm(1)
    else:
        threading.Thread(target=pool.warm, args=(1,), daemon=True).start()
        time.sleep(0.3)
    print("parent going", flush=True)
    os._exit(0)
""")


def _orphan_check(when: str) -> None:
    mark = uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-c", _PARENT, when], capture_output=True, text=True, timeout=300,
                          env=_env(mark))   # returns once every holder of the pipes (the worker too) is gone
    assert proc.returncode == 0 and proc.stdout == "parent going\n", proc.stderr[-2000:]
    assert proc.stderr == "", proc.stderr[-2000:]
    assert _none_left(mark) == []


def test_a_starting_worker_exits_quietly_when_its_parent_dies():
    _orphan_check("starting")


def test_an_idle_worker_exits_when_its_parent_dies():
    _orphan_check("idle")


def test_a_busy_worker_exits_when_its_parent_is_killed():
    """The parent-watch: a worker inside a long call (socket still open in no one) ends within a second."""
    mark = uuid.uuid4().hex
    code = textwrap.dedent("""
        import os, signal, time
        from dgemma_struct.constraints.compile_pool import CompilePool
        pool = CompilePool(size=1, memory_mb=None)
        pool.warm(1)
        import threading
        threading.Thread(target=lambda: pool.run(time.sleep, 60, timeout_s=120), daemon=True).start()
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env(mark))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert _none_left(mark) == []
    assert time.monotonic() - started < 55   # not the 60 s sleep: the worker did not finish its call


def _start_serve(mark: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dgemma_struct.cli", "serve", "--port", "0", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(mark))


def test_ctrl_c_while_the_model_loads_leaves_nothing(mapped):
    """SIGINT once the checkpoint is being read (its file mapped): one line (exit 130), or, when the load
    had already finished, uvicorn's clean shutdown before it; never a traceback, never a process left behind."""
    mark = uuid.uuid4().hex
    proc = _start_serve(mark)
    deadline = time.monotonic() + 240
    while not mapped(proc.pid, "model.safetensors") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    err = _ended(proc)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode in (130, 0), (proc.returncode, err[-3000:])
    _interrupted_lines(err)
    assert _none_left(mark) == []


def _ended(proc: subprocess.Popen, timeout_s: float = 120) -> str:
    """The stderr of ``proc`` once it has exited; if it has not within ``timeout_s``, a failure showing
    where every thread was (faulthandler's dump on SIGABRT), and the process gone."""
    try:
        return proc.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            err = proc.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            err = proc.communicate()[1]
        raise AssertionError(f"still running {timeout_s:g} s after SIGINT; its threads:\n{err[-6000:]}") from None


def _interrupted_lines(err: str) -> None:
    """What a Ctrl-C may print: ``error: interrupted`` alone (the load was still running), or, when
    uvicorn had already started, its own shutdown lines before it (uvicorn re-raises the SIGINT)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[-1] == "error: interrupted", err[-3000:]
    assert all(ln.startswith("INFO:") for ln in lines[:-1]), err[-3000:]
    if len(lines) > 1:
        assert any("Finished server process" in ln for ln in lines), err[-3000:]


def test_ctrl_c_right_after_start_up_leaves_no_traceback():
    """SIGINT as soon as uvicorn reports start-up complete, while the warm-up's compile is still in a
    worker: the shutdown kills the worker, and the compile nobody waits for any more is not reported
    as an unhandled error by asyncio (it was, with a traceback)."""
    mark = uuid.uuid4().hex
    proc = _start_serve(mark)
    seen = []
    for line in proc.stderr:   # blocks per line; the process ends (EOF) if it fails before start-up
        seen.append(line)
        if "Application startup complete" in line:
            break
    assert any("Application startup complete" in ln for ln in seen), "".join(seen)[-3000:]
    proc.send_signal(signal.SIGINT)
    err = "".join(seen) + _ended(proc)
    assert "Traceback" not in err and "unhandled exception" not in err, err[-3000:]
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    _interrupted_lines(err)
    assert _none_left(mark) == []
