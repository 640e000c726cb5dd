"""The soak's fault: fx_slow's execute gate shut and opened at random, so deadlines and cancellations hit held
slots."""

from __future__ import annotations

import random
import threading
from pathlib import Path


class GateFlapper(threading.Thread):
    """The fault: shuts fx_slow's execute gate for 0.2..1.5 s, opens it for 0.5..3 s, over and over."""

    def __init__(self, gates: Path, seed: int) -> None:
        super().__init__(name="gate-flapper", daemon=True)
        self.release = gates / "fx_slow.execute.release"
        self.rng = random.Random(seed)
        self._halt = threading.Event()
        self.shut_count = 0

    def run(self) -> None:
        while not self._halt.is_set():
            self.release.unlink(missing_ok=True)
            self.shut_count += 1
            self._halt.wait(self.rng.uniform(0.2, 1.5))
            self.release.touch()
            self._halt.wait(self.rng.uniform(0.5, 3.0))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)
        self.release.touch()
