"""`langgraph dev` on 127.0.0.1, started and stopped by the suite (by its process id).

The server runs the repository's `langgraph.json` with the offline model, offline (tracing
and analytics off), in a temporary folder (its own state goes there), WITHOUT
`--allow-blocking`: a blocking call on its event loop fails the run that made it and is
written to its log, which `blocking_calls` reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0
"""Seconds the server may take to answer `/ok` (it imports a lot on a cold machine)."""
STOP_TIMEOUT = 15.0

OFFLINE_ENV = {
    "LANGSMITH_TRACING": "false",
    "LANGSMITH_TRACING_V2": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_API_KEY": "",
    "LANGCHAIN_API_KEY": "",
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGSMITH_OTEL_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True, slots=True)
class DevServer:
    """A running `langgraph dev`: its URL and its log."""

    url: str
    log: Path
    pid: int

    def blocking_calls(self) -> list[str]:
        """Each blocking call the server's checker caught, with the stack that made it."""
        text = self.log.read_text(errors="replace")
        found: list[str] = []
        for block in text.split("Traceback (most recent call last):")[1:]:
            if "BlockingError: Blocking call" in block:
                end = block.find("BlockingError: Blocking call")
                line_end = block.find("\n", end)
                found.append(block[: line_end if line_end != -1 else None].strip())
        return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"langgraph dev exited ({proc.returncode}):\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ok", timeout=2.0).status_code == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"langgraph dev did not answer in {START_TIMEOUT}s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its reloader, started by us
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT)


@contextlib.contextmanager
def running_server(
    workdir: Path, config: Path = ROOT / "langgraph.json", jobs: int | None = None, **env: str
) -> Iterator[DevServer]:
    """Start `langgraph dev` in `workdir` with the given extra environment, serving the graphs
    of `config` with at most `jobs` runs at once (the server's default: 10); stop it after."""
    port = free_port()
    log = workdir / "langgraph-dev.log"
    cli = Path(sys.executable).parent / "langgraph"
    command = [
        str(cli), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1",
        "--port", str(port), "--config", str(config),
        *(["--n-jobs-per-worker", str(jobs)] if jobs else []),
    ]  # fmt: skip
    environ = {
        **os.environ,
        **OFFLINE_ENV,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        **env,
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, cwd=workdir, env=environ, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, log)
        yield DevServer(url, log, proc.pid)
    finally:
        _stop(proc)
