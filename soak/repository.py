"""The soak's model repository, built in its work folder.

The demo ONNX models `simple`, `simple_identity`, `identity_fp32` (copies from demo/model_repository: run
`make models` first; a symbolic link out of the repository would be refused) and fixture models `fx_echo` (plain),
`fx_stream` (3 answers per request), `fx_slow` (a file gate at execute that soak/faults.py opens and shuts: callers
block while it is shut, so deadlines and cancellations hit held slots), `fx_flaky` (the `ops` clients switch its
fail_load option on and off: reconfigurations and loads that fail) and `fx_broken` (its load always fails).
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "demo" / "model_repository"
ONNX_MODELS = ("simple", "simple_identity", "identity_fp32")
FIXTURES: dict[str, dict[str, str | None]] = {
    "fx_echo": {},
    "fx_stream": {"stream_responses": "3"},
    "fx_slow": {"gate_dir": None},  # filled in with the work folder's gate folder
    "fx_flaky": {},
    "fx_broken": {"fail_load": "always"},
}
REGISTERED = ONNX_MODELS + tuple(FIXTURES)
STREAMING_MODELS = frozenset(name for name, options in FIXTURES.items() if "stream_responses" in options)


def build_repository(work: Path) -> tuple[Path, Path]:
    if not (DEMO / "simple" / "config.pbtxt").exists():
        raise SystemExit(f"soak: the demo repository is missing at {DEMO}: run `make models` first")
    repository, gates = work / "repository", work / "gates"
    repository.mkdir(parents=True)
    gates.mkdir()
    for name in ONNX_MODELS:
        shutil.copytree(DEMO / name, repository / name)  # a few KiB each
    for name, parameters in FIXTURES.items():
        directory = repository / name
        directory.mkdir()
        lines = [f'name: "{name}"', 'backend: "fixture"', "max_batch_size: 0"]
        for key, value in parameters.items():
            value = str(gates) if key == "gate_dir" else value
            lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
        (directory / "config.pbtxt").write_text("\n".join(lines) + "\n")
    (gates / "fx_slow.execute.hold").touch()  # the gate exists; the fault thread opens and shuts it
    (gates / "fx_slow.execute.release").touch()
    return repository, gates
