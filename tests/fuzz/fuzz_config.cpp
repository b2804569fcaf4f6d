// libFuzzer target for the TOML config loader: parse_config(), the function
// load_config_file() (qrtd run, qrtd check-config) hands the file's text to.
// The bytes are the file; the first byte picks whether the host's online
// CPUs are known (check-config and run pass them).  Checked on every input:
//   - the loader never throws or crashes, whatever the bytes;
//   - a rejected file gets at least one diagnostic, each naming the file,
//     with a message, on a line that exists in the file;
//   - an accepted file renders (render_config, what config-reference
//     prints) to TOML that the loader accepts again as the same
//     configuration (config_to_json equal): the one renderer and the one
//     loader agree on every value that got through.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "qrt/config.hpp"

namespace {

[[noreturn]] void fail(const char* what, std::string_view detail) {
    std::fprintf(stderr, "fuzz_config: %s: %.*s\n", what, static_cast<int>(detail.size()), detail.data());
    std::abort();
}

const char* const source = "fuzz.toml";

void check_diagnostics(const qrt::config_load_result& res, std::string_view text) {
    if (res.ok()) {
        return;
    }
    std::size_t lines = 1;
    for (const char c : text) {
        lines += c == '\n' ? 1 : 0;
    }
    for (const auto& d : res.errors) {
        if (d.file != source || d.message.empty() || d.line > lines) {
            fail("a diagnostic without file, message or a line of the file", d.to_string());
        }
        if (d.to_string().rfind(source, 0) != 0) {
            fail("a diagnostic that does not start with the file name", d.to_string());
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    spdlog::set_level(spdlog::level::off);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) {
        return 0;
    }
    qrt::config_load_options opts;
    if ((data[0] & 1U) != 0) {
        rtcore::cpu_set online;
        for (unsigned c = 0; c < 4; ++c) {
            online.set(c);
        }
        opts.online_cpus = online;
    }
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    qrt::config_load_result res;
    try {
        res = qrt::parse_config(text, source, opts);
    } catch (const std::exception& e) {
        fail("parse_config threw", e.what());
    }
    check_diagnostics(res, text);
    if (!res.ok()) {
        return 0;
    }
    const std::string rendered = qrt::render_config(res.cfg);
    const auto again = qrt::parse_config(rendered, source, opts);
    if (!again.ok()) {
        fail("the rendering of an accepted config is rejected", again.error_text());
    }
    const auto a = qrt::config_to_json(res.cfg);
    const auto b = qrt::config_to_json(again.cfg);
    if (a != b) {
        fail("a config changed across render and parse", a.dump() + "\n" + b.dump());
    }
    return 0;
}
