#pragma once
// qrt-protogen's model of agent/proto/protocol.toml: the table read and
// checked (every name unique, every reference resolved, the header's offsets
// and size) before any language is written from it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qrt::protogen {

struct named_value {
    std::string name;
    std::int64_t value = 0;
    std::string doc;
    std::string outcome;  // wire errors: the job outcome reason it maps to
    int since = 1;        // frame types: the first wire version that has it
};

struct header_field {
    std::string name;
    std::string type;  // u8 u16 u32 u64 i64
    std::string doc;
    int since = 1;           // the first wire version whose header has it
    std::size_t offset = 0;  // computed
    std::size_t size = 0;    // computed
};

struct wire_version {
    int version = 0;
    std::uint32_t header_len = 0;
    std::uint32_t max_hello_payload = 0;
    std::string doc;
};

struct capability {
    std::string name;
    std::string type;  // string bool u32 i64
    std::string doc;
};

struct reason {
    std::string name;
    std::optional<int> code;  // raised as a JSON-RPC error
    int exit_code = 1;
    std::string meaning;
    std::string outcome;  // "", never_sent, failed, unknown
    std::string outcome_meaning;
};

struct client_reason {
    std::string name;
    int exit_code = 1;
    std::string meaning;
};

struct state {
    std::string name;
    bool active = false;
    bool finishes_job = false;
    std::vector<std::string> next;
    std::string meaning;
};

// A calibration block's state: live ones are a blackout in the timeline.
struct block_state {
    std::string name;
    bool live = false;
    std::string meaning;
};

struct role {
    std::string name;
    int bit = -1;  // -1: none
    std::string meaning;
};

struct method {
    std::string name;
    std::string role;
};

struct event {
    std::string name;
    bool tenant = false;
};

struct model {
    // wire
    std::string wire_doc;
    std::uint32_t magic = 0;
    std::string magic_doc;
    std::vector<wire_version> versions;  // ascending
    std::uint32_t max_payload = 0;
    std::string max_payload_doc;
    std::vector<named_value> types;
    std::vector<named_value> flags;  // value = bit
    std::vector<named_value> errors;
    std::vector<named_value> stages;
    std::vector<capability> capabilities;
    std::vector<header_field> header;  // every version's fields, in order
    // rpc
    std::vector<std::pair<std::string, int>> codes;  // code_* constants, in order
    std::vector<reason> reasons;
    std::vector<client_reason> client_reasons;
    std::vector<state> states;
    std::vector<block_state> block_states;
    std::vector<role> roles;
    std::vector<method> methods;
    std::string event_method;
    std::vector<event> events;
    // envelope
    std::string envelope_doc;
    std::string envelope_format;
    std::string envelope_result_format;
    int envelope_max_circuits = 0;
    std::string qasm_header;
    // auth
    std::string auth_doc;
    std::string auth_payload_version;
};

// Reads and checks the table; on failure the message names the entry and
// what is wrong with it.
struct load_result {
    std::optional<model> m;
    std::string error;
};
load_result load(const std::string& path);

// One generated file: its path relative to the repository's top and its
// full text.
struct output {
    std::string path;
    std::string text;
};
std::vector<output> generate(const model& m);

// Each writer, for tests and for --lang.
std::string write_c(const model& m);
std::string write_cpp(const model& m);
std::string write_python(const model& m);
std::string write_go(const model& m);
std::string write_c_names(const model& m);

}  // namespace qrt::protogen
