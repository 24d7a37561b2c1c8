"""The kernels' AVX-512 VNNI paths give the very bits of their AVX2 paths (integer dot products
are exact, and the float steps around them are the same operations in the same order).

On a machine with AVX-512 VNNI, the library is built twice, as `loraserve build-kernels` builds
it for this CPU and again with AVX-512 off (``LORASERVE_KERNEL_NO_AVX512=1``); each build
multiplies the same random rows of every quantized type (and the packed layouts) by the same
activations at 1, 4, 8, 13 and 21 rows (from 16 on, the packed types' pairs of groups) and
both block sizes, through qmatmul and the fused
multi-part call. Their outputs are compared byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.model.quant_util import QUANT, ROOT, has_vnni, run_python

CODE = r"""
import hashlib, json, sys
import numpy as np, torch
sys.path.insert(0, {root!r})
from loraserve import cbuild
import loraserve.kernels as K
from loraserve.model.dequant import GGML_TYPE
from tests.unit.model.quant_util import random_rows
assert K.backend() == "c"
out = {{"isa": cbuild.library().ls_isa()}}
for name in {names!r}:
    t = GGML_TYPE[name]
    rng = np.random.default_rng(t)
    for k in (256, 1024):
        raw = torch.from_numpy(random_rows(rng, name, 24, k))
        x = torch.from_numpy(rng.standard_normal((21, k)).astype(np.float32))
        h = hashlib.sha256()
        for m in (1, 4, 8, 13, 21):
            xa = K.quantize_rows(x[:m], K.activation_block(t))
            h.update(K.qmatmul(xa, raw, t).numpy().tobytes())
            packed = K.pack_rows(raw, t, k)
            if packed is not None:
                h.update(K.qmatmul(xa, packed, K.PACKED | t).numpy().tobytes())
            y = torch.zeros(m, 48)
            K.QuantizedParts([(raw, t, 0), (raw[:8], t, 24), (raw[8:24], t, 32)])(x[:m], y)
            h.update(y.numpy().tobytes())
        out[f"{{name}}/{{k}}"] = h.hexdigest()
print(json.dumps(out))
"""


@pytest.mark.skipif(not has_vnni(), reason="this CPU has no AVX-512 VNNI")
def test_avx512_vnni_and_avx2_builds_give_the_same_bits(tmp_path: Path) -> None:
    code = CODE.format(root=ROOT, names=QUANT)
    native = run_python(code, {})
    avx2 = run_python(code, {"LORASERVE_KERNEL_NO_AVX512": "1", "LORASERVE_CACHE": str(tmp_path),
                             "LORASERVE_PREBUILT_DIR": str(tmp_path / "none")})  # fmt: skip
    assert native.pop("isa") == 7, "the native build does not use AVX-512 VNNI"
    assert avx2.pop("isa") == 1, "the AVX2 build still has AVX-512"
    assert len(native) == 2 * len(QUANT)
    differ = sorted(key for key in native if native[key] != avx2[key])
    assert not differ, f"AVX-512 VNNI and AVX2 outputs differ: {differ}"
