"""What the supervisor checks before launching llama-server (issue 27), and how it picks the
line of the engine's output that says why a launch failed."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loki_shared import servers
from loki_supervisor.engine_process import telling_line
from loki_supervisor.preflight import ModelFileError, check_model_file


def test_the_bundled_model_passes() -> None:
    check_model_file(servers.find_bundled_model())


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: d / "absent.gguf", "does not exist"),
        (lambda d: d, "is a directory"),
        (lambda d: _write(d / "page.gguf", b"<html>404</html>"), "is not a GGUF file"),
        (lambda d: _write(d / "empty.gguf", b""), "is not a GGUF file"),
    ],
    ids=["missing", "directory", "html", "empty"],
)
def test_a_model_that_cannot_work_is_refused_with_the_reason(
    tmp_path: Path, make, says: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(ModelFileError) as err:
        check_model_file(path, "LOKI_MODEL")
    assert says in str(err.value) and str(path) in str(err.value)
    assert "LOKI_MODEL" in str(err.value) and err.value.permanent


def test_an_unreadable_model_is_refused(tmp_path: Path) -> None:
    model = _write(tmp_path / "model.gguf", b"GGUF" + bytes(64))
    model.chmod(0o000)
    # Root reads any file: the check runs in a process without that power (dropped from its
    # capability bounding set before exec), or as is for a plain user.
    code = (
        "import sys; from pathlib import Path\n"
        "from loki_supervisor.preflight import ModelFileError, check_model_file\n"
        "try:\n"
        "    check_model_file(Path(sys.argv[1]), \"model of preset 'big' (p1)\")\n"
        "    print('accepted')\n"
        "except ModelFileError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(model)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_drop_file_read_override if os.geteuid() == 0 else None,
    )
    message = out.stdout.strip()
    assert "cannot be read" in message and "permission denied" in message, out
    assert "model of preset 'big' (p1)" in message


def test_the_telling_line_is_the_first_error_without_its_prefix() -> None:
    refused_gguf = [
        "0.00.006.000 I srv    load_model: loading model '/tmp/broken.gguf'",
        "0.00.007.000 E gguf_init_from_reader: this GGUF file is version 3944515455 but "
        "this software only supports up to version 3",
        "0.00.007.000 E gguf_init_from_reader: failed to read header",
        "0.00.007.417 E srv  llama_server: exiting due to model loading error",
    ]
    assert telling_line(refused_gguf).startswith("gguf_init_from_reader: this GGUF file is")
    bad_flag = ["warning: no usable GPU found", "error: invalid argument: --no-such-flag"]
    assert telling_line(bad_flag) == "error: invalid argument: --no-such-flag"
    assert telling_line(["just this"]) == "just this" and telling_line([]) == ""


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _drop_file_read_override() -> None:  # pragma: no cover - runs in the child
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl")
