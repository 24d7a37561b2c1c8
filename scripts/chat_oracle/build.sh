#!/usr/bin/env bash
# Build the chat oracle programs against the peer llama.cpp's own build (never in CI).
#   [ORACLE_ONLY=1] scripts/chat_oracle/build.sh [PEER_LLAMA_CPP_DIR]
# Needs `cmake --build build --target llama-common test-chat` done in the peer tree first
# (test-chat's objects are not used; its target builds libserver-context.a, which the
# patched test-chat copy links). Outputs go to ~/.cache/loraserve/chat_oracle/.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PEER="${1:-$HOME/.cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp}"
B="$PEER/build"
OUT="${CHAT_ORACLE_DIR:-$HOME/.cache/loraserve/chat_oracle}"
mkdir -p "$OUT"
INC=(-I"$HERE" -I"$PEER/tools/server" -I"$PEER/common" -I"$PEER/vendor" -I"$PEER/include"
     -I"$PEER/ggml/include" -I"$PEER/tools/mtmd")
DEF=(-DGGML_BACKEND_SHARED -DGGML_SHARED -DGGML_USE_CPU -DLLAMA_SHARED -DLLAMA_SUBPROCESS -DNDEBUG)
LIBS=("$B/bin/libllama-common.so" "$B/common/libllama-common-base.a" "$B/bin/libllama.so"
      "$B/bin/libggml.so" "$B/bin/libggml-cpu.so" "$B/bin/libggml-base.so")
RPATH=(-Wl,-rpath,"$B/bin" -rdynamic)

g++ -std=c++17 -O1 "${DEF[@]}" "${INC[@]}" "$HERE/chat_oracle.cpp" -o "$OUT/chat_oracle" \
    "${RPATH[@]}" "${LIBS[@]}"
echo "built $OUT/chat_oracle"

if [[ -z "${ORACLE_ONLY:-}" && -f "$B/tools/server/libserver-context.a" ]]; then
    # test-chat.cpp with every peg test case also written to $CHAT_ORACLE_PARSE_OUT (JSON lines)
    python3 "$HERE/patch_test_chat.py" "$PEER/tests/test-chat.cpp" "$OUT/test-chat-oracle.cpp"
    g++ -std=c++17 -O1 "${DEF[@]}" "${INC[@]}" -I"$PEER/tests" -I"$PEER/src" \
        "$OUT/test-chat-oracle.cpp" -o "$OUT/test-chat-oracle" "${RPATH[@]}" \
        "$B/tools/server/libserver-context.a" "${LIBS[@]}" "$B/bin/libmtmd.so"
    echo "built $OUT/test-chat-oracle"
fi
