// Shared by chat_oracle.cpp and the patched copy of llama.cpp's tests/test-chat.cpp:
// a fixed clock (so date_string / datetime / strftime_now are reproducible) and the JSON
// forms of llama.cpp's chat structures as the recorded test data spells them.
#pragma once

#include "chat.h"
#include "json.h"

#include <ctime>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>

// 2025-03-14T09:26:53Z. Rendered with TZ=UTC: date_string "14 Mar 2025", datetime "Mar 14 2025".
#define ORACLE_FIXED_EPOCH 1741944413

// Interpose the clock: libllama-common.so reads the time through std::chrono::system_clock
// (libstdc++ -> clock_gettime) and std::time (jinja strftime_now); the executable's definitions
// win over libc's at dynamic link time.
extern "C" int clock_gettime(clockid_t clk, struct timespec * ts) {
    if (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE) {
        ts->tv_sec  = ORACLE_FIXED_EPOCH;
        ts->tv_nsec = 0;
        return 0;
    }
    return (int) syscall(SYS_clock_gettime, clk, ts);
}

extern "C" time_t time(time_t * t) {
    if (t) {
        *t = ORACLE_FIXED_EPOCH;
    }
    return ORACLE_FIXED_EPOCH;
}

static inline common_json oracle_msg_json(const common_chat_msg & m) {
    common_json j = common_json::object();
    j["role"]              = m.role;
    j["content"]           = m.content;
    j["reasoning_content"] = m.reasoning_content;
    auto calls             = common_json::array();
    for (const auto & tc : m.tool_calls) {
        calls.push_back(common_json::object({ { "name", tc.name }, { "arguments", tc.arguments }, { "id", tc.id } }));
    }
    j["tool_calls"] = calls;
    if (!m.content_parts.empty()) {
        auto parts = common_json::array();
        for (const auto & p : m.content_parts) {
            parts.push_back(common_json::object({ { "type", p.type }, { "text", p.text } }));
        }
        j["content_parts"] = parts;
    }
    if (!m.tool_name.empty()) {
        j["tool_name"] = m.tool_name;
    }
    if (!m.tool_call_id.empty()) {
        j["tool_call_id"] = m.tool_call_id;
    }
    return j;
}

static inline const char * oracle_trigger_type(common_grammar_trigger_type t) {
    switch (t) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "?";
}

static inline const char * oracle_tool_choice(common_chat_tool_choice c) {
    switch (c) {
        case COMMON_CHAT_TOOL_CHOICE_AUTO: return "auto";
        case COMMON_CHAT_TOOL_CHOICE_REQUIRED: return "required";
        case COMMON_CHAT_TOOL_CHOICE_NONE: return "none";
    }
    return "?";
}

static inline const char * oracle_continuation(common_chat_continuation c) {
    switch (c) {
        case COMMON_CHAT_CONTINUATION_NONE: return "none";
        case COMMON_CHAT_CONTINUATION_AUTO: return "auto";
        case COMMON_CHAT_CONTINUATION_REASONING: return "reasoning_content";
        case COMMON_CHAT_CONTINUATION_CONTENT: return "content";
    }
    return "?";
}

// What common_chat_templates_apply answered, minus the serialized PEG arena (`parser`).
static inline common_json oracle_params_json(const common_chat_params & p) {
    common_json j = common_json::object();
    j["prompt"]             = p.prompt;
    j["generation_prompt"]  = p.generation_prompt;
    j["format"]             = common_chat_format_name(p.format);
    j["supports_thinking"]  = p.supports_thinking;
    j["thinking_start_tag"] = p.thinking_start_tag;
    j["thinking_end_tags"]  = p.thinking_end_tags;
    j["grammar"]            = p.grammar;
    j["grammar_lazy"]       = p.grammar_lazy;
    auto triggers           = common_json::array();
    for (const auto & t : p.grammar_triggers) {
        triggers.push_back(common_json::object({ { "type", oracle_trigger_type(t.type) }, { "value", t.value } }));
    }
    j["grammar_triggers"] = triggers;
    j["preserved_tokens"] = p.preserved_tokens;
    j["additional_stops"] = p.additional_stops;
    return j;
}

// A message as an OpenAI chat-completion body spells it (what common_chat_msgs_parse_oaicompat
// reads back into the same common_chat_msg).
static inline common_json oracle_msg_oai(const common_chat_msg & m) {
    common_json j = common_json::object();
    j["role"]     = m.role;
    if (!m.content_parts.empty()) {
        auto parts = common_json::array();
        for (const auto & p : m.content_parts) {
            parts.push_back(common_json::object({ { "type", p.type }, { "text", p.text } }));
        }
        j["content"] = parts;
    } else if (m.content.empty() && !m.tool_calls.empty()) {
        j["content"] = nullptr;
    } else {
        j["content"] = m.content;
    }
    if (!m.reasoning_content.empty()) {
        j["reasoning_content"] = m.reasoning_content;
    }
    if (!m.tool_calls.empty()) {
        auto calls = common_json::array();
        for (const auto & tc : m.tool_calls) {
            auto call        = common_json::object();
            call["type"]     = "function";
            call["function"] = common_json::object({ { "name", tc.name }, { "arguments", tc.arguments } });
            if (!tc.id.empty()) {
                call["id"] = tc.id;
            }
            calls.push_back(call);
        }
        j["tool_calls"] = calls;
    }
    if (!m.tool_name.empty()) {
        j["name"] = m.tool_name;
    }
    if (!m.tool_call_id.empty()) {
        j["tool_call_id"] = m.tool_call_id;
    }
    return j;
}
