"""One build of the C kernels: the compiler runs (one per unit, all at once) into a temporary
folder, and the linked library is moved into place when every step succeeds."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from loraserve.cbuild_env import SRC_DIR, _torch_dir, cflags, trust

log = logging.getLogger("loraserve.kernels")


class Build:
    """The compiler runs (one per unit of ``units``, all at once) into a temporary folder; the
    linked library is moved into place when every step succeeds."""

    def __init__(self, cc: str, out: Path, units: tuple[tuple[str, ...], ...]) -> None:
        self.cc, self.out = cc, out
        self.tmp = tempfile.mkdtemp(dir=out.parent)
        self.objs = [Path(self.tmp) / f"unit{i}.o" for i in range(len(units))]
        flags = [f for f in cflags() if f != "-shared"]
        self.procs = []
        for i, (unit, obj) in enumerate(zip(units, self.objs, strict=True)):
            src = Path(self.tmp) / f"unit{i}.c"  # diagnostics still name the real files
            src.write_text("".join(f'#include "{SRC_DIR / s}"\n' for s in unit))
            self.procs.append(
                subprocess.Popen(
                    [cc, *flags, f"-I{SRC_DIR}", "-c", str(src), "-o", str(obj)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )  # fmt: skip
            )

    def finish(self) -> bool:
        try:
            errs = [p.communicate()[1] for p in self.procs]
            if any(p.returncode != 0 for p in self.procs):
                err = b"".join(errs).decode(errors="replace")[-2000:]
                log.warning("compiling the C kernels failed, using the slower pure-torch "
                            "path:\n%s", err)  # fmt: skip
                return False
            torch_lib = _torch_dir() / "lib"
            tmp_out = Path(self.tmp) / self.out.name
            link = subprocess.run(
                [self.cc, *cflags(), *map(str, self.objs), "-o", str(tmp_out),
                 f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lm"],
                capture_output=True,
            )  # fmt: skip
            if link.returncode != 0:
                log.warning("linking the C kernels failed, using the slower pure-torch path:"
                            "\n%s", link.stderr.decode(errors="replace")[-2000:])  # fmt: skip
                return False
            trust.record(self.out, tmp_out)  # the hash a load checks (`trust.open_verified`)
            os.replace(tmp_out, self.out)  # atomic: concurrent starts never see half
            log.info("compiled the C kernels for this CPU (%s)", self.out)
            return True
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
