// chat_oracle: answers chat-template questions with llama.cpp's own `common` library, for
// scripts/chat_oracle/record.py. Reads one JSON request per line on stdin, writes one JSON
// answer per line on stdout. No model is loaded (common_chat_templates_init(nullptr, src)).
//
// Every query may carry "bos_token" and "eos_token" (the template's, "" when absent).
//   {"op": "info",   "template": PATH}
//       -> {"caps": {...}, "supports_enable_thinking": bool, "source": the source llama.cpp
//           renders (after its own patches), "analysis": {"specialized": bool, ...markers}}
//   {"op": "render", "template": PATH, "request": REQ}
//       -> common_chat_params as JSON (oracle_params_json) or {"error": "..."}
//   {"op": "parse",  "template": PATH, "request": REQ, "text": STR, "is_partial": bool,
//    "stream": bool}
//       -> {"message": MSG} (and "prefixes": [[len, MSG], ...] when stream) or {"error": ...}
//   {"op": "parse", ..., "texts": [STR, ...], "is_partial": bool}
//       -> {"messages": [MSG | {"error": ...}, ...]} (one template apply for all texts)
//
// REQ holds the fields of a /v1/chat/completions body that reach common_chat_templates_apply:
// messages, tools, tool_choice, parallel_tool_calls, add_generation_prompt,
// continue_final_message, enable_thinking, reasoning_format, chat_template_kwargs, json_schema.
#include "oracle_common.h"

#include "chat-auto-parser.h"
#include "chat.h"
#include "log.h"

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

using json = common_json;

static std::string read_file(const std::string & path) {
    std::ifstream fs(path, std::ios_base::binary);
    if (!fs) {
        throw std::runtime_error("cannot open " + path);
    }
    std::stringstream ss;
    ss << fs.rdbuf();
    return ss.str();
}

// No model: bos_token / eos_token are what the query says ("" when absent), add_bos/add_eos false.
static common_chat_templates * get_templates(const json & q) {
    static std::map<std::string, common_chat_templates_ptr> cache;
    const std::string path = q.at("template");
    const std::string bos  = q.value("bos_token", std::string());
    const std::string eos  = q.value("eos_token", std::string());
    const std::string key  = path + "\n" + bos + "\n" + eos;
    auto              it   = cache.find(key);
    if (it == cache.end()) {
        it = cache.emplace(key, common_chat_templates_init(nullptr, read_file(path), bos, eos)).first;
    }
    return it->second.get();
}

template <typename E> static std::string enum_name(E e) {
    std::ostringstream os;
    os << e;
    return os.str();
}

// Which path common_chat_templates_apply takes for this template, and for the differential
// analyser's path its findings (chat-auto-parser.h), as llama-server computes them.
static json analyze(const common_chat_templates * tmpls, const json & q) {
    const std::string src = common_chat_templates_source(tmpls);
    common_chat_template tmpl(src, q.value("bos_token", std::string()), q.value("eos_token", std::string()));
    json out = json::object();
    {
        autoparser::generation_params params;
        params.messages = json::array({ json::object({ { "role", "user" }, { "content", "hi" } }) });
        params.add_generation_prompt = true;
        try {
            out["specialized"] = common_chat_try_specialized_template(tmpl, src, params).has_value();
        } catch (const std::exception & e) {
            out["specialized"] = true;  // a detector matched, then failed on this input
        }
    }
    if (out["specialized"].get<bool>()) {
        return out;
    }
    autoparser::autoparser ap;
    try {
        ap.analyze_template(tmpl);
    } catch (const std::exception & e) {
        out["error"] = e.what();
        return out;
    }
    const auto & r = ap.reasoning;
    const auto & c = ap.content;
    const auto & t = ap.tools;
    out["user_start"]      = ap.user_start;
    out["assistant_start"] = ap.assistant_start;
    out["reasoning"] = json::object({ { "mode", enum_name(r.mode) }, { "start", r.start }, { "end", r.end } });
    out["content"]   = json::object({ { "mode", enum_name(c.mode) }, { "start", c.start }, { "end", c.end },
                                      { "requires_nonnull_content", c.requires_nonnull_content } });
    json fmt = json::object();
    fmt["mode"]                   = enum_name(t.format.mode);
    fmt["section_start"]          = t.format.section_start;
    fmt["section_end"]            = t.format.section_end;
    fmt["per_call_start"]         = t.format.per_call_start;
    fmt["per_call_end"]           = t.format.per_call_end;
    fmt["fun_name_is_key"]        = t.format.fun_name_is_key;
    fmt["tools_array_wrapped"]    = t.format.tools_array_wrapped;
    fmt["openai_wrapper_trigger"] = t.format.openai_wrapper_trigger;
    fmt["function_field"]         = t.format.function_field;
    fmt["name_field"]             = t.format.name_field;
    fmt["args_field"]             = t.format.args_field;
    fmt["id_field"]               = t.format.id_field;
    fmt["gen_id_field"]           = t.format.gen_id_field;
    fmt["parameter_order"]        = t.format.parameter_order;
    json args = json::object();
    args["start"]        = t.arguments.start;
    args["end"]          = t.arguments.end;
    args["name_prefix"]  = t.arguments.name_prefix;
    args["name_suffix"]  = t.arguments.name_suffix;
    args["value_prefix"] = t.arguments.value_prefix;
    args["value_suffix"] = t.arguments.value_suffix;
    args["separator"]    = t.arguments.separator;
    args["tolerate_intertag_whitespace"] = t.arguments.tolerate_intertag_whitespace;
    out["tools"] = json::object({
        { "format", fmt },
        { "function", json::object({ { "name_prefix", t.function.name_prefix },
                                     { "name_suffix", t.function.name_suffix },
                                     { "args_separator", t.function.args_separator },
                                     { "close", t.function.close } }) },
        { "arguments", args },
        { "call_id", json::object({ { "pos", enum_name(t.call_id.pos) }, { "prefix", t.call_id.prefix },
                                    { "suffix", t.call_id.suffix } }) },
    });
    out["preserved_tokens"] = ap.preserved_tokens;
    out["additional_stops"] = ap.additional_stops;
    return out;
}

static common_chat_templates_inputs make_inputs(const json & req) {
    common_chat_templates_inputs in;
    in.messages = common_chat_msgs_parse_oaicompat(req.at("messages"));
    if (req.contains("tools") && !req.at("tools").is_null()) {
        in.tools = common_chat_tools_parse_oaicompat(req.at("tools"));
    }
    in.tool_choice         = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
    in.parallel_tool_calls = req.value("parallel_tool_calls", false);
    in.add_generation_prompt = req.value("add_generation_prompt", true);
    if (req.contains("continue_final_message")) {
        in.continue_final_message = common_chat_continuation_parse(req.at("continue_final_message"));
    }
    in.enable_thinking  = req.value("enable_thinking", true);
    in.reasoning_format = common_reasoning_format_from_name(req.value("reasoning_format", std::string("deepseek")));
    if (req.contains("chat_template_kwargs")) {
        for (const auto & item : req.at("chat_template_kwargs").items()) {
            in.chat_template_kwargs[item.key()] = item.value().dump();
        }
    }
    if (req.contains("json_schema") && !req.at("json_schema").is_null()) {
        in.json_schema = req.at("json_schema").dump();
    }
    in.use_jinja = true;
    return in;
}

static json answer(const json & q) {
    const std::string op   = q.at("op");
    auto *            tmpl = get_templates(q);
    if (op == "info") {
        json caps = json::object();
        for (const auto & [k, v] : common_chat_templates_get_caps(tmpl)) {
            caps[k] = v;
        }
        return json::object({ { "caps", caps },
                              { "supports_enable_thinking", common_chat_templates_support_enable_thinking(tmpl) },
                              { "source", common_chat_templates_source(tmpl) },
                              { "analysis", analyze(tmpl, q) } });
    }
    auto inputs = make_inputs(q.at("request"));
    auto params = common_chat_templates_apply(tmpl, inputs);
    if (op == "render") {
        return oracle_params_json(params);
    }
    if (op == "parse") {
        common_peg_arena arena;
        arena.load(params.parser);
        common_chat_parser_params pp(params);
        if (q.contains("parser_reasoning_format")) {
            pp.reasoning_format = common_reasoning_format_from_name(q.at("parser_reasoning_format"));
        }
        pp.parse_tool_calls = q.value("parse_tool_calls", true);
        const bool is_partial = q.value("is_partial", false);
        json       out        = json::object();
        if (q.contains("texts")) {
            auto msgs = json::array();
            for (const auto & t : q.at("texts")) {
                try {
                    msgs.push_back(oracle_msg_json(common_chat_peg_parse(arena, t.get<std::string>(), is_partial, pp)));
                } catch (const std::exception & e) {
                    msgs.push_back(json::object({ { "error", e.what() } }));
                }
            }
            out["messages"] = msgs;
            return out;
        }
        const std::string text = q.at("text");
        out["message"] = oracle_msg_json(common_chat_peg_parse(arena, text, is_partial, pp));
        if (q.value("stream", false)) {
            auto prefixes = json::array();
            for (size_t i = 1; i <= text.size(); ++i) {
                try {
                    auto m = common_chat_peg_parse(arena, text.substr(0, i), i < text.size() || is_partial, pp);
                    prefixes.push_back(json::array({ i, oracle_msg_json(m) }));
                } catch (const std::exception & e) {
                    prefixes.push_back(json::array({ i, json::object({ { "error", e.what() } }) }));
                }
            }
            out["prefixes"] = prefixes;
        }
        return out;
    }
    throw std::runtime_error("unknown op " + op);
}

int main() {
    setenv("TZ", "UTC", 1);
    tzset();
    common_log_set_verbosity_thold(-1);
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.empty()) {
            continue;
        }
        json out;
        try {
            out = answer(json::parse(line));
        } catch (const std::exception & e) {
            out = json::object({ { "error", e.what() } });
        }
        std::cout << out.dump() << "\n" << std::flush;
    }
    return 0;
}
