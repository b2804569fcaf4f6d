#include "request_reader.hpp"

#include <vector>

namespace qrt::rpc {

namespace {

enum class member : std::uint8_t { none, jsonrpc, method, id, params, other };

member member_of(std::string_view key) noexcept {
    if (key == "jsonrpc") {
        return member::jsonrpc;
    }
    if (key == "method") {
        return member::method;
    }
    if (key == "id") {
        return member::id;
    }
    if (key == "params") {
        return member::params;
    }
    return member::other;
}

// nlohmann's SAX interface (json::sax_parse).  depth counts the open arrays
// and objects; the envelope is depth 1.  A member's value that is an array
// or object is built as a document for "id" and "params" (a stack of the
// containers being filled, as nlohmann's own DOM reader keeps), and skipped
// otherwise.
class envelope_reader {
public:
    envelope_reader(line_read& out, std::size_t max_depth) : _out(out), _max_depth(max_depth) {}

    bool null() { return value(json(nullptr)); }
    bool boolean(bool b) { return value(json(b)); }
    bool number_integer(json::number_integer_t n) { return value(json(n)); }
    bool number_unsigned(json::number_unsigned_t n) { return value(json(n)); }
    bool number_float(json::number_float_t n, const std::string& /*text*/) { return value(json(n)); }
    bool string(std::string& s) {
        if (_depth == 1) {  // a member's value: no document for it
            switch (_member) {
                case member::jsonrpc:
                    _out.jsonrpc = s == "2.0" ? request_view::version::v2 : request_view::version::other;
                    return done_member();
                case member::method:
                    _out.method_ok = true;
                    _out.method.assign(s);
                    return done_member();
                default:
                    break;
            }
        }
        return value(json(s));
    }
    bool binary(json::binary_t& b) { return value(json::binary(b)); }

    bool start_object(std::size_t /*elements*/) { return open(json::value_t::object); }
    bool start_array(std::size_t /*elements*/) { return open(json::value_t::array); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }

    bool key(std::string& k) {
        if (_depth == 1) {
            _member = member_of(k);
            if (_member == member::other && (!_out.has_unknown || k < _out.unknown)) {
                _out.has_unknown = true;
                _out.unknown.assign(k);
            }
        } else if (!_stack.empty()) {
            _key.assign(k);
        }
        return true;
    }

    bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const json::exception& ex) {
        _out.what = line_read::kind::parse_error;
        _out.error = ex.what();
        return false;
    }

private:
    // The member's value as a scalar, or one inside a document being built.
    bool value(json v) {
        if (_depth == 0) {  // the line is a scalar, not a request object
            _out.is_object = false;
            _out.type_name = v.type_name();
            return true;
        }
        if (_depth == 1) {
            switch (_member) {
                case member::jsonrpc:
                    _out.jsonrpc = request_view::version::not_string;
                    break;
                case member::method:
                    _out.method_ok = false;
                    break;
                case member::id:
                    _out.has_id = true;
                    _out.id = std::move(v);
                    break;
                case member::params:
                    _out.has_params = true;
                    _out.params = std::move(v);
                    break;
                default:
                    break;
            }
            return done_member();
        }
        if (!_stack.empty()) {
            json& top = *_stack.back();
            if (top.is_array()) {
                top.push_back(std::move(v));
            } else {
                top[_key] = std::move(v);
            }
        }
        return true;
    }

    bool open(json::value_t type) {
        if (++_depth > _max_depth) {
            _out.what = line_read::kind::too_deep;
            return false;
        }
        if (_depth == 1) {
            if (type == json::value_t::array) {
                _out.what = line_read::kind::batch;  // read as a document by the caller
                return false;
            }
            _out.is_object = true;
            return true;
        }
        if (_depth == 2) {
            json* root = nullptr;
            switch (_member) {
                case member::jsonrpc:
                    _out.jsonrpc = request_view::version::not_string;
                    break;
                case member::method:
                    _out.method_ok = false;
                    break;
                case member::id:
                    _out.has_id = true;
                    root = &_out.id;
                    break;
                case member::params:
                    _out.has_params = true;
                    root = &_out.params;
                    break;
                default:
                    break;
            }
            if (root != nullptr) {
                *root = json(type);
                _stack.push_back(root);
            }
            return true;
        }
        if (!_stack.empty()) {
            json& top = *_stack.back();
            json* child = nullptr;
            if (top.is_array()) {
                top.push_back(json(type));
                child = &top.back();
            } else {
                child = &(top[_key] = json(type));
            }
            _stack.push_back(child);
        }
        return true;
    }

    bool close() {
        if (!_stack.empty() && _depth >= 2) {
            _stack.pop_back();
        }
        if (--_depth == 1) {
            return done_member();
        }
        return true;
    }

    bool done_member() {
        _member = member::none;
        return true;
    }

    line_read& _out;
    std::size_t _max_depth;
    std::size_t _depth = 0;
    member _member = member::none;
    std::vector<json*> _stack;  // the containers being filled, innermost last
    std::string _key;           // the key of the value that comes next
};

}  // namespace

request_view view_of(const json& request) {
    request_view v;
    v.is_object = request.is_object();
    v.type_name = request.type_name();
    if (!v.is_object) {
        return v;
    }
    for (const auto& [key, value] : request.items()) {  // in name order
        switch (member_of(key)) {
            case member::jsonrpc:
                v.jsonrpc = !value.is_string() ? request_view::version::not_string
                            : value.get_ref<const std::string&>() == "2.0" ? request_view::version::v2
                                                                           : request_view::version::other;
                break;
            case member::method:
                v.method = value.is_string() ? &value.get_ref<const std::string&>() : nullptr;
                break;
            case member::id:
                v.id = &value;
                break;
            case member::params:
                v.params = &value;
                break;
            default:
                if (!v.has_unknown) {
                    v.has_unknown = true;
                    v.unknown = key;
                }
                break;
        }
    }
    return v;
}

request_view line_read::view() const {
    request_view v;
    v.is_object = is_object;
    v.type_name = type_name;
    v.id = has_id ? &id : nullptr;
    v.has_unknown = has_unknown;
    v.unknown = unknown;
    v.jsonrpc = jsonrpc;
    v.method = method_ok ? &method : nullptr;
    v.params = has_params ? &params : nullptr;
    return v;
}

void read_line(std::string_view line, std::size_t max_depth, line_read& out) {
    out.what = line_read::kind::request;
    out.error.clear();
    out.is_object = false;
    out.type_name = "";
    out.has_id = false;
    out.has_unknown = false;
    out.jsonrpc = request_view::version::missing;
    out.method_ok = false;
    out.has_params = false;
    envelope_reader reader(out, max_depth);
    (void)json::sax_parse(line.begin(), line.end(), &reader);
}

}  // namespace qrt::rpc
