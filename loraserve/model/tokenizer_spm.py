"""SentencePiece encoding of GGUF 'llama' vocabularies, equal to llama.cpp's SPM tokenizer.

llama.cpp's SPM session is a BPE merge over single UTF-8 characters ranked by token score, with
byte fallback for what no token covers. The `sentencepiece` library runs the same algorithm when
it is given a BPE model with exactly the GGUF pieces, scores and byte pieces, an identity
normalizer without dummy prefix, and spaces escaped to U+2581 as llama.cpp does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: protobuf's import is ~0.1 s of every cold start
    import sentencepiece as spm

TOKEN_TYPE_BYTE = 6


def build_spm(
    texts: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int],
    unk_id: int | None,
) -> spm.SentencePieceProcessor:
    """A SentencePieceProcessor over the GGUF pieces in id order.

    Every piece is NORMAL so that merges may reach any token text, as in llama.cpp (which looks
    merges up among all tokens); BYTE pieces stay BYTE for byte fallback and the unknown token
    is the one UNKNOWN piece that sentencepiece requires.
    """
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    kind = pb.ModelProto.SentencePiece
    kinds = np.where(np.asarray(types) == TOKEN_TYPE_BYTE, kind.BYTE, kind.NORMAL)
    if unk_id is not None:
        kinds[unk_id] = kind.UNKNOWN
    proto = pb.ModelProto()
    trainer = proto.trainer_spec
    trainer.model_type = pb.TrainerSpec.BPE
    trainer.vocab_size = len(texts)
    trainer.byte_fallback = True
    trainer.unk_id = unk_id if unk_id is not None else 0
    normalizer = proto.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = False
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    # a message's fields may come in any order and in pieces: the pieces, then the rest
    wire = pieces_wire(texts, scores, kinds) + proto.SerializeToString()
    return spm.SentencePieceProcessor(model_proto=wire)


def _varint(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of v [n] (each < 2**21): (their lengths [n], their bytes [n, 3])."""
    if v.size and int(v.max()) >= 1 << 21:
        raise ValueError("a vocabulary piece over 2 MiB")
    n = 1 + (v >= 1 << 7) + (v >= 1 << 14)
    b = np.stack([v & 0x7F, (v >> 7) & 0x7F, v >> 14], axis=1).astype(np.uint8)  # [n, 3]
    b[:, 0] |= np.where(n > 1, 0x80, 0).astype(np.uint8)
    b[:, 1] |= np.where(n > 2, 0x80, 0).astype(np.uint8)
    return n, b


def pieces_wire(texts: Sequence[str], scores: Sequence[float], kinds: np.ndarray) -> bytes:
    """The `pieces` field of a sentencepiece ModelProto in protobuf's wire format, built with
    numpy: protobuf's own `pieces.add` took ~0.45 s for Gemma's 262,144 pieces (most of a
    cold start's tokenizer time), this ~0.05 s. Each piece: its text (field 1), score (field
    2, float) and type (field 3, left out when NORMAL, the default)."""
    data = [t.encode("utf-8", "surrogateescape") for t in texts]
    size = np.fromiter(map(len, data), dtype=np.int64, count=len(data))  # [V]
    kinds = np.asarray(kinds, dtype=np.int64)
    typed = kinds != 1  # [V] (NORMAL = 1, the default)
    tn, tb = _varint(size)
    inner = 1 + tn + size + 5 + 2 * typed  # one piece's message
    on, ob = _varint(inner)
    total = 1 + on + inner  # the piece as a field of ModelProto
    start = np.concatenate([[0], np.cumsum(total)[:-1]])  # [V]
    out = np.zeros(int(total.sum()), dtype=np.uint8)
    out[start] = 0x0A  # field 1, length-delimited
    for k in range(3):  # the outer length, then the text's tag and length
        m = on > k
        out[start[m] + 1 + k] = ob[m, k]
    text_tag = start + 1 + on
    out[text_tag] = 0x0A
    for k in range(3):
        m = tn > k
        out[text_tag[m] + 1 + k] = tb[m, k]
    first = text_tag + 1 + tn  # each text's first byte
    flat = np.frombuffer(b"".join(data), dtype=np.uint8)
    shift = first - np.concatenate([[0], np.cumsum(size)[:-1]])  # output minus input offset
    out[np.repeat(shift, size) + np.arange(flat.size)] = flat
    score_at = first + size
    out[score_at] = 0x15  # field 2, 32-bit
    out[score_at[:, None] + 1 + np.arange(4)] = (
        np.asarray(scores, dtype="<f4").view(np.uint8).reshape(-1, 4)
    )
    out[score_at[typed] + 5] = 0x18  # field 3, varint
    out[score_at[typed] + 6] = kinds[typed].astype(np.uint8)
    return out.tobytes()
