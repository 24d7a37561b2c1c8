"""SentencePiece encoding of GGUF 'llama' vocabularies, equal to llama.cpp's SPM tokenizer.

llama.cpp's SPM session is a BPE merge over single UTF-8 characters ranked by token score, with
byte fallback for what no token covers. The `sentencepiece` library runs the same algorithm when
it is given a BPE model with exactly the GGUF pieces, scores and byte pieces, an identity
normalizer without dummy prefix, and spaces escaped to U+2581 as llama.cpp does.
"""

from __future__ import annotations

from collections.abc import Sequence

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

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
    kind = pb.ModelProto.SentencePiece
    proto = pb.ModelProto()
    add = proto.pieces.add
    for i, (text, score, ttype) in enumerate(zip(texts, scores, types, strict=True)):
        if i == unk_id:
            add(piece=text, score=score, type=kind.UNKNOWN)
        elif ttype == TOKEN_TYPE_BYTE:
            add(piece=text, score=score, type=kind.BYTE)
        else:
            add(piece=text, score=score, type=kind.NORMAL)
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
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())
