"""Copy llama.cpp's tests/test-chat.cpp so that every PEG parser case it passes is recorded.

    python patch_test_chat.py PEER/tests/test-chat.cpp OUT/test-chat-oracle.cpp

The copy writes one JSON line per passed `peg_test_builder::run()` to the file named by
$CHAT_ORACLE_PARSE_OUT: the template, the request (OpenAI form), the input text, is_partial,
the test's expected message, llama.cpp's own parse of the whole text, the chat params that
drive the parser and grammar, and every streaming prefix whose parse changed. Everything
else in the test is unchanged (it still asserts all of its checks).
"""

from __future__ import annotations

import sys
from pathlib import Path


def sub(text: str, old: str, new: str) -> str:
    """Replace `old` exactly once (fail loudly when llama.cpp's test changed shape)."""
    if text.count(old) != 1:
        raise SystemExit(f"patch_test_chat: expected one {old!r}, found {text.count(old)}")
    return text.replace(old, new)


GLOBALS = r"""
static std::string g_oracle_template;
static common_json g_oracle_rec;
static common_json g_oracle_last;

static void oracle_begin(const peg_test_case & tc, const common_chat_params & p) {
    auto req = common_json::object();
    auto msgs = common_json::array();
    for (const auto & m : tc.params.messages) {
        msgs.push_back(oracle_msg_oai(m));
    }
    req["messages"]               = msgs;
    req["tools"]                  = common_chat_tools_to_json_oaicompat(tc.params.tools);
    req["tool_choice"]            = oracle_tool_choice(tc.params.tool_choice);
    req["parallel_tool_calls"]    = tc.params.parallel_tool_calls;
    req["enable_thinking"]        = tc.params.enable_thinking;
    req["reasoning_format"]       = common_reasoning_format_name(tc.params.reasoning_format);
    req["add_generation_prompt"]  = tc.params.add_generation_prompt;
    req["continue_final_message"] = oracle_continuation(tc.params.continue_final_message);
    const auto & schema           = tc.params.json_schema;
    req["json_schema"]            = schema.empty() ? common_json() : common_json::parse(schema);
    g_oracle_rec               = common_json::object();
    g_oracle_rec["template"]   = g_oracle_template;
    g_oracle_rec["request"]    = req;
    g_oracle_rec["input"]      = tc.input;
    g_oracle_rec["is_partial"] = tc.is_partial;
    auto expect                = tc.expect;
    g_oracle_rec["expect"]     = oracle_msg_json(expect);
    auto params                = oracle_params_json(p);
    params.erase("prompt");
    g_oracle_rec["params"]     = params;
    g_oracle_rec["stream"]     = common_json::array();
    g_oracle_last              = common_json();
}

static void oracle_prefix(size_t len, bool is_partial, const common_chat_msg & m) {
    auto j = oracle_msg_json(m);
    if (j.dump() != g_oracle_last.dump()) {
        g_oracle_rec["stream"].push_back(common_json::array({ len, is_partial, j }));
        g_oracle_last = j;
    }
}

static void oracle_write() {
    const char * path = getenv("CHAT_ORACLE_PARSE_OUT");
    if (!path) {
        return;
    }
    FILE * f = fopen(path, "a");
    fprintf(f, "%s\n", g_oracle_rec.dump().c_str());
    fclose(f);
}
"""

WRAPPER = r"""
static void test_peg_parser(common_chat_templates *                      tmpls,
                            const std::function<void(peg_test_case &)> & init,
                            bool                                         detailed_debug) {
    test_peg_parser_impl(tmpls, init, detailed_debug);
    oracle_write();
}

// Fluent builder for PEG parser tests
"""


def patch(src: str, peer: Path) -> str:
    """The recording copy of test-chat.cpp's source."""
    src = sub(src, '#include "../src/llama-grammar.h"', f'#include "{peer}/src/llama-grammar.h"')
    src = sub(src, '#include "../src/unicode.h"', f'#include "{peer}/src/unicode.h"')
    src = sub(
        src,
        '#include "../tools/server/server-chat.h"',
        f'#include "{peer}/tools/server/server-chat.h"\n#include "oracle_common.h"',
    )
    src = sub(
        src,
        "static bool g_force_reconstruction_test = false;\n",
        "static bool g_force_reconstruction_test = false;\n" + GLOBALS,
    )
    src = sub(
        src,
        "static void test_peg_parser(common_chat_templates *",
        "static void test_peg_parser_impl(common_chat_templates *",
    )
    src = sub(
        src,
        "    auto parser = make_peg_parser(tmpls, tc.params, detailed_debug);\n",
        "    auto parser = make_peg_parser(tmpls, tc.params, detailed_debug);\n"
        "    oracle_begin(tc, parser.params_);\n",
    )
    src = sub(
        src,
        "        common_chat_msg msg_current = parser.parse(prefix, is_partial);\n",
        "        common_chat_msg msg_current = parser.parse(prefix, is_partial);\n"
        "        oracle_prefix(safe_len, is_partial, msg_current);\n",
    )
    final_check = "    if (!tc.is_partial) {\n        assert_msg_equals(tc.expect, parser.parse("
    src = sub(
        src,
        final_check,
        '    g_oracle_rec["parsed"] = oracle_msg_json(parser.parse(tc.input, tc.is_partial));\n'
        + final_check,
    )
    src = sub(src, "\n// Fluent builder for PEG parser tests\n", WRAPPER)
    src = sub(
        src,
        "        test_peg_parser(tester_.tmpls_.get(), [this]",
        "        g_oracle_template = tester_.template_path();\n"
        "        test_peg_parser(tester_.tmpls_.get(), [this]",
    )
    return src


def main() -> None:
    src_path, out_path = Path(sys.argv[1]), Path(sys.argv[2])
    peer = src_path.resolve().parent.parent
    out_path.write_text(patch(src_path.read_text(), peer))


if __name__ == "__main__":
    main()
