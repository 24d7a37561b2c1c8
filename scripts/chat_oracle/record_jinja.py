"""Record llama.cpp's Jinja engine answers as test data (never run in CI).

    python scripts/chat_oracle/record_jinja.py   # -> tests/data/chat/jinja_cases.json

Copies the peer's tests/test-jinja.cpp (307 template cases of llama.cpp's own engine test:
whitespace control, undefined values, filters, tests, string/array/object methods, macros,
namespaces...), plus `EXTRA` (cases of ours where jinja2 and llama.cpp differ), makes its
`test_template_cpp` also write each case as one JSON line (name,
template, variables, the test's expectation, and what the engine rendered or the error it
raised), builds it against the peer's build (`cmake --build build --target llama-common`
first) and runs it. `tests/unit/chat/test_jinja_oracle.py` renders every case with
`loraserve.chat.jinja_env` and compares.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = Path.home() / ".cache/loraserve/peer/llama_cpp_python-0.3.36/vendor/llama.cpp"
OUT = ROOT / "tests" / "data" / "chat" / "jinja_cases.json"

RENDER = """            for (const auto & part : parts->as_string().parts) {
                rendered += part.val;
            }
"""
DUMP = (
    RENDER
    + """            g_dump_case(tmpl, vars, expect, &rendered, nullptr);
"""
)
CATCH = """        } catch (const jinja::not_implemented_exception & e) {
            t.skip(e.what());
        }
    });
}"""
CATCH_DUMP = """        } catch (const jinja::not_implemented_exception & e) {
            t.skip(e.what());
        } catch (const std::exception & e) {
            g_dump_case(tmpl, vars, expect, nullptr, e.what());
            throw;
        }
    });
}"""
HELPER = """
#include <fstream>
static std::string g_case_name;
static void g_dump_case(const std::string & tmpl, const json & vars, const std::string & expect,
                        const std::string * rendered, const char * error) {
    static std::ofstream out(std::getenv("JINJA_CASES_OUT"));
    json j = {{"name", g_case_name}, {"template", tmpl}, {"vars", vars}, {"expect", expect}};
    if (rendered) { j["rendered"] = *rendered; } else { j["error"] = std::string(error); }
    out << j.dump() << "\\n";
    out.flush();
}
"""


# Cases of ours on llama.cpp's semantics where jinja2's differ (recorded: what the engine
# renders, or the error it raises; the expectation passed is ignored).
EXTRA = [
    (
        "ours: undefined joined to a string",
        "{{ 'a' + x }}|{{ x ~ 'b' }}|{{ 'c' + none }}|{{ none ~ 'd' }}",
        {},
    ),
    (
        "ours: attribute chain on undefined",
        "{{ x.y.z }}|{{ x['y']['z'] is defined }}|{{ x.y is undefined }}",
        {},
    ),
    (
        "ours: loop over an undefined attribute",
        "{% for i in x.y %}{{ i }}{% endfor %}done",
        {"x": {}},
    ),
    (
        "ours: printing values",
        "{{ ['a', 1, none, 2.5] }}|{{ {'a': 1} }}|{{ none }}|{{ true }}|{{ 1.0 }}|{{ 0.1 }}",
        {},
    ),
    ("ours: string plus number", "{{ 'a' + 1 }}|{{ 'b' + 2.5 }}|{{ 'c' ~ 3 }}", {}),
    (
        "ours: tojson",
        "{{ x | tojson }}|{{ x | tojson(indent=2) }}",
        {"x": {"b": [1, "\u00e9", None, True], "a": {"c": 'q"t'}}},
    ),
    (
        "ours: string filter",
        "{{ ['a', \"b'c\", 1] | string }}|{{ 5 | string }}|{{ none | string }}"
        "|{{ {'k': none} | string }}",
        {},
    ),
    ("ours: safe stays plain text", "{{ '<b>'|safe + '&' + x }}", {"x": "<i>"}),
    (
        "ours: filters answer lists",
        "{{ items|map(attribute='a')|length }}|{{ items|selectattr('a')|length }}"
        "|{{ items|map(attribute='a')|tojson }}",
        {"items": [{"a": 1}, {"a": 0}, {"b": 2}]},
    ),
    ("ours: items of none", "{% for k, v in x|items %}{{ k }}{% endfor %}ok", {"x": None}),
    (
        "ours: append and pop",
        "{% set l = [1] %}{% set _ = l.append(2) %}{{ l|length }}{{ l.pop() }}{{ l|length }}",
        {},
    ),
    ("ours: in undefined", "{{ 'a' in x }}|{{ 'a' not in x }}", {}),
    (
        "ours: dict get",
        "{{ d.get('k', 'def') }}|{{ d.get('m') }}|{{ d.get('n', 'x') }}",
        {"d": {"n": 1}},
    ),
    ("ours: concat list to string", "{{ 'x' ~ [1, 'a'] }}|{{ 'y' + ['b'] }}", {}),
    (
        "ours: message content missing",
        "{% for m in messages %}[{{ m.role }}:{{ m.content }}:{{ m.tool_calls|length }}]"
        "{% endfor %}",
        {"messages": [{"role": "user"}, {"role": "assistant", "content": None}]},
    ),
]


def _extra_calls() -> str:
    calls = []
    for name, tmpl, vars_ in EXTRA:
        calls.append(
            f"    test_template(t, {json.dumps(name)}, {json.dumps(tmpl)}, "
            f'json::parse({json.dumps(json.dumps(vars_))}), "");'
        )
    return "static void test_ours(testing & t) {\n" + "\n".join(calls) + "\n}\n"


def patched_source() -> str:
    """test-jinja.cpp with every case dumped (see the module docstring) and `EXTRA`."""
    src = (PEER / "tests" / "test-jinja.cpp").read_text()
    for old, new in ((RENDER, DUMP), (CATCH, CATCH_DUMP)):
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    head = "static bool g_python_mode = false;"
    src = src.replace(head, head + HELPER, 1)
    main = "int main(int argc, char *argv[]) {"
    src = src.replace(main, _extra_calls() + main, 1)
    first = '    t.test("whitespace control", test_whitespace_control);'
    src = src.replace(first, '    t.test("ours", test_ours);\n' + first, 1)
    name_line = (
        "    t.test(name, [&tmpl, &vars, &expect](testing & t) {\n        jinja::lexer lexer;"
    )
    assert src.count(name_line) == 1
    return src.replace(
        name_line,
        "    g_case_name = name;\n" + name_line,
    )


def main() -> None:
    b = PEER / "build"
    with tempfile.TemporaryDirectory() as tmp:
        cpp, exe, lines = Path(tmp, "test-jinja.cpp"), Path(tmp, "test-jinja"), Path(tmp, "out")
        cpp.write_text(patched_source())
        inc = ["common", "vendor", "include", "ggml/include", "tests"]
        subprocess.run(
            ["g++", "-std=c++17", "-O1", "-DNDEBUG", "-DLLAMA_SHARED", "-DGGML_SHARED",
             *(f"-I{PEER / i}" for i in inc), str(cpp), "-o", str(exe),
             f"-Wl,-rpath,{b / 'bin'}", str(b / "bin" / "libllama-common.so"),
             str(b / "common" / "libllama-common-base.a"), str(b / "bin" / "libllama.so"),
             str(b / "bin" / "libggml.so"), str(b / "bin" / "libggml-base.so")],
            check=True,
        )  # fmt: skip
        run = subprocess.run([str(exe)], env={**os.environ, "JINJA_CASES_OUT": str(lines)},
                             capture_output=True, text=True)  # fmt: skip
        cases = [json.loads(line) for line in lines.read_text().splitlines()]
    meta = {
        "source": "llama.cpp vendored in the llama-cpp-python 0.3.36 sdist (tests/test-jinja.cpp)",
        "recorded_by": "scripts/chat_oracle/record_jinja.py",
        "test_jinja_exit": run.returncode,  # 1: the EXTRA cases carry no expectation
    }
    OUT.write_text(json.dumps({"meta": meta, "cases": cases}, ensure_ascii=False, indent=0) + "\n")
    print(f"{len(cases)} cases -> {OUT} (test-jinja exit {run.returncode})")


if __name__ == "__main__":
    main()
