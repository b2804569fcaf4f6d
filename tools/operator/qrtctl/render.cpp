#include "render.hpp"

#include <algorithm>
#include <cstdio>

#include "units.hpp"

namespace qrtctl {

namespace {

const json& null_json() {
    static const json n;
    return n;
}

std::string scalar(const json& v) {
    if (v.is_null()) {
        return "-";
    }
    if (v.is_string()) {
        const auto& s = v.get_ref<const std::string&>();
        return s.empty() ? "-" : s;
    }
    if (v.is_object()) {
        // Labels and other flat maps: k=v,k=v.
        std::string out;
        for (const auto& [k, e] : v.items()) {
            out += (out.empty() ? "" : ",") + k + "=" + scalar(e);
        }
        return out.empty() ? "-" : out;
    }
    return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

void flatten(const json& v, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
    if (v.is_object()) {
        if (v.empty()) {
            out.emplace_back(prefix, "{}");
        }
        for (const auto& [k, child] : v.items()) {
            flatten(child, prefix.empty() ? k : prefix + "." + k, out);
        }
        return;
    }
    if (v.is_array()) {
        const bool scalars = std::all_of(v.begin(), v.end(), [](const json& e) {
            return !e.is_object() && !e.is_array();
        });
        if (scalars) {
            out.emplace_back(prefix, v.empty() ? "-" : show(v, shown_as::list));
            return;
        }
        for (std::size_t i = 0; i < v.size(); ++i) {
            flatten(v[i], prefix + "[" + std::to_string(i) + "]", out);
        }
        return;
    }
    out.emplace_back(prefix, scalar(v));
}

}  // namespace

const json& at_path(const json& obj, std::string_view dotted) {
    const json* cur = &obj;
    while (!dotted.empty()) {
        const auto dot = dotted.find('.');
        const std::string key(dotted.substr(0, dot));
        if (!cur->is_object()) {
            return null_json();
        }
        const auto it = cur->find(key);
        if (it == cur->end()) {
            return null_json();
        }
        cur = &*it;
        dotted = dot == std::string_view::npos ? std::string_view() : dotted.substr(dot + 1);
    }
    return *cur;
}

std::string show(const json& v, shown_as how) {
    switch (how) {
    case shown_as::time:
        if (v.is_number_integer() && v.get<std::int64_t>() > 0) {
            return format_time_ns(v.get<std::int64_t>());
        }
        return v.is_null() || (v.is_number() && v.get<double>() == 0.0) ? "-" : scalar(v);
    case shown_as::duration:
        if (v.is_number_integer()) {
            return format_duration_ns(v.get<std::int64_t>());
        }
        return scalar(v);
    case shown_as::fixed3:
        if (v.is_number()) {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%.3f", v.get<double>());
            return buf;
        }
        return scalar(v);
    case shown_as::yes_no:
        if (v.is_boolean()) {
            return v.get<bool>() ? "yes" : "no";
        }
        return scalar(v);
    case shown_as::list:
        if (v.is_array()) {
            std::string out;
            for (const auto& e : v) {
                if (!out.empty()) {
                    out += ',';
                }
                out += scalar(e);
            }
            return out.empty() ? "-" : out;
        }
        return scalar(v);
    case shown_as::text:
        break;
    }
    return scalar(v);
}

std::string table::render() const {
    std::vector<std::size_t> width(_headers.size(), 0);
    const auto measure = [&](const std::vector<std::string>& row) {
        for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) {
            width[i] = std::max(width[i], row[i].size());
        }
    };
    measure(_headers);
    for (const auto& r : _rows) {
        measure(r);
    }
    std::string out;
    const auto emit = [&](const std::vector<std::string>& row) {
        std::string line;
        for (std::size_t i = 0; i < width.size(); ++i) {
            const std::string& cell = i < row.size() ? row[i] : std::string();
            line += cell;
            if (i + 1 < width.size()) {
                line.append(width[i] - cell.size() + 2, ' ');
            }
        }
        while (!line.empty() && line.back() == ' ') {
            line.pop_back();
        }
        out += line;
        out += '\n';
    };
    emit(_headers);
    for (const auto& r : _rows) {
        emit(r);
    }
    return out;
}

table make_table(const json& items, std::span<const column> cols) {
    std::vector<std::string> headers;
    headers.reserve(cols.size());
    for (const auto& c : cols) {
        headers.emplace_back(c.header);
    }
    table t(std::move(headers));
    if (!items.is_array()) {
        return t;
    }
    for (const auto& item : items) {
        std::vector<std::string> row;
        row.reserve(cols.size());
        for (const auto& c : cols) {
            row.push_back(show(at_path(item, c.key), c.how));
        }
        t.add_row(std::move(row));
    }
    return t;
}

table make_table_auto(const json& items) {
    std::vector<std::string> keys;
    if (items.is_array()) {
        for (const auto& item : items) {
            if (!item.is_object()) {
                continue;
            }
            for (const auto& [k, v] : item.items()) {
                if (!v.is_object() && std::find(keys.begin(), keys.end(), k) == keys.end()) {
                    keys.push_back(k);
                }
            }
        }
    }
    std::vector<std::string> headers;
    for (const auto& k : keys) {
        std::string h = k;
        std::transform(h.begin(), h.end(), h.begin(),
                       [](char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; });
        headers.push_back(std::move(h));
    }
    table t(std::move(headers));
    if (!items.is_array()) {
        return t;
    }
    for (const auto& item : items) {
        std::vector<std::string> row;
        for (const auto& k : keys) {
            const json& v = item.is_object() && item.contains(k) ? item.at(k) : null_json();
            row.push_back(show(v, shown_as::list));
        }
        t.add_row(std::move(row));
    }
    return t;
}

std::string render_fields(const json& obj, std::span<const column> fields) {
    // Present: the top member exists (null values are shown as "-").
    const auto present = [&](const column& f) {
        return obj.is_object() && obj.contains(std::string(f.key.substr(0, f.key.find('.'))));
    };
    std::size_t width = 0;
    for (const auto& f : fields) {
        if (present(f)) {
            width = std::max(width, f.header.size());
        }
    }
    std::string out;
    for (const auto& f : fields) {
        if (!present(f)) {
            continue;
        }
        out += std::string(f.header) + ":";
        out.append(width - f.header.size() + 1, ' ');
        out += show(at_path(obj, f.key), f.how);
        out += '\n';
    }
    return out;
}

std::string render_flat(const json& obj) {
    std::vector<std::pair<std::string, std::string>> rows;
    flatten(obj, "", rows);
    std::size_t width = 0;
    for (const auto& r : rows) {
        width = std::max(width, r.first.size());
    }
    std::string out;
    for (const auto& [k, v] : rows) {
        out += k + ":";
        out.append(width - k.size() + 1, ' ');
        out += v;
        out += '\n';
    }
    return out;
}

}  // namespace qrtctl
