#include "mlp.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace qrt::fleet {

namespace tl = qrt::timeline;

namespace {

const char* to_string(activation a) noexcept {
    switch (a) {
    case activation::relu: return "relu";
    case activation::tanh: return "tanh";
    case activation::linear: return "linear";
    }
    return "linear";
}

tl::error bad(const std::string& what) {
    return tl::make_error(tl::reason::invalid_argument, "mlp: " + what);
}

}  // namespace

mlp::mlp(const std::vector<std::size_t>& sizes, activation act) {
    for (std::size_t i = 0; i + 1 < sizes.size(); ++i) {
        dense_layer l;
        l.in = sizes[i];
        l.out = sizes[i + 1];
        l.act = i + 2 == sizes.size() ? activation::linear : act;
        l.w.assign(l.in * l.out, 0.0F);
        l.b.assign(l.out, 0.0F);
        _layers.push_back(std::move(l));
    }
    if (!sizes.empty()) {
        _mean.assign(sizes.front(), 0.0F);
        _std.assign(sizes.front(), 1.0F);
    }
}

float mlp::eval1(const float* x) const noexcept {
    if (_layers.empty()) {
        return 0.0F;
    }
    std::size_t widest = 0;
    for (const dense_layer& l : _layers) {
        widest = std::max({widest, l.in, l.out});
    }
    if (_a.size() < widest) {
        _a.resize(widest);
        _b.resize(widest);
    }
    const std::size_t n = _layers.front().in;
    for (std::size_t i = 0; i < n; ++i) {
        _a[i] = (x[i] - _mean[i]) / _std[i];
    }
    float* in = _a.data();
    float* out = _b.data();
    for (const dense_layer& l : _layers) {
        for (std::size_t o = 0; o < l.out; ++o) {
            const float* row = l.w.data() + o * l.in;
            float s = l.b[o];
            for (std::size_t i = 0; i < l.in; ++i) {
                s += row[i] * in[i];
            }
            switch (l.act) {
            case activation::relu: s = s > 0.0F ? s : 0.0F; break;
            case activation::tanh: s = std::tanh(s); break;
            case activation::linear: break;
            }
            out[o] = s;
        }
        std::swap(in, out);
    }
    return in[0];
}

std::string mlp::serialize() const {
    std::string s = "qrt-mlp 1\ninputs " + std::to_string(inputs()) + "\nlayers " +
                    std::to_string(_layers.size()) + "\n";
    char buf[32];
    auto num = [&](float v) {
        std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
        return std::string(buf);
    };
    for (const dense_layer& l : _layers) {
        s += "layer " + std::to_string(l.in) + " " + std::to_string(l.out) + " " +
             to_string(l.act) + "\n";
        for (std::size_t o = 0; o < l.out; ++o) {
            for (std::size_t i = 0; i < l.in; ++i) {
                s += (i == 0 ? "" : " ") + num(l.w[o * l.in + i]);
            }
            s += "\n";
        }
        for (std::size_t o = 0; o < l.out; ++o) {
            s += (o == 0 ? "" : " ") + num(l.b[o]);
        }
        s += "\n";
    }
    s += "norm";
    for (const float m : _mean) {
        s += " " + num(m);
    }
    for (const float d : _std) {
        s += " " + num(d);
    }
    s += "\nend\n";
    return s;
}

tl::result<mlp> mlp::parse(std::string_view text) {
    // Drop comment lines, then read tokens.
    std::string clean;
    std::istringstream lines{std::string(text)};
    for (std::string line; std::getline(lines, line);) {
        if (!line.empty() && line.front() == '#') {
            continue;
        }
        clean += line;
        clean += '\n';
    }
    std::istringstream in(clean);
    std::string tok;
    int version = 0;
    if (!(in >> tok) || tok != "qrt-mlp" || !(in >> version) || version != 1) {
        return bad("not a 'qrt-mlp 1' file");
    }
    std::size_t n = 0;
    std::size_t layers = 0;
    if (!(in >> tok) || tok != "inputs" || !(in >> n) || n == 0 || n > 4096) {
        return bad("'inputs <n>' missing or out of range 1..4096");
    }
    if (!(in >> tok) || tok != "layers" || !(in >> layers) || layers == 0 || layers > 16) {
        return bad("'layers <L>' missing or out of range 1..16");
    }
    mlp m;
    std::size_t prev = n;
    for (std::size_t k = 0; k < layers; ++k) {
        dense_layer l;
        std::string act;
        if (!(in >> tok) || tok != "layer" || !(in >> l.in >> l.out >> act)) {
            return bad("layer " + std::to_string(k) + ": 'layer <in> <out> <activation>' missing");
        }
        if (l.in != prev || l.out == 0 || l.out > 4096) {
            return bad("layer " + std::to_string(k) + ": " + std::to_string(l.in) + " inputs, " +
                       "the previous layer gives " + std::to_string(prev));
        }
        if (act == "relu") {
            l.act = activation::relu;
        } else if (act == "tanh") {
            l.act = activation::tanh;
        } else if (act == "linear") {
            l.act = activation::linear;
        } else {
            return bad("layer " + std::to_string(k) + ": activation \"" + act +
                       "\" is not relu, tanh or linear");
        }
        l.w.resize(l.in * l.out);
        l.b.resize(l.out);
        for (float& v : l.w) {
            if (!(in >> v) || !std::isfinite(v)) {
                return bad("layer " + std::to_string(k) + ": a weight is missing or not finite");
            }
        }
        for (float& v : l.b) {
            if (!(in >> v) || !std::isfinite(v)) {
                return bad("layer " + std::to_string(k) + ": a bias is missing or not finite");
            }
        }
        prev = l.out;
        m._layers.push_back(std::move(l));
    }
    if (!(in >> tok) || tok != "norm") {
        return bad("'norm' line missing");
    }
    m._mean.resize(n);
    m._std.resize(n);
    for (float& v : m._mean) {
        if (!(in >> v) || !std::isfinite(v)) {
            return bad("norm: a mean is missing or not finite");
        }
    }
    for (float& v : m._std) {
        if (!(in >> v) || !(v > 0.0F) || !std::isfinite(v)) {
            return bad("norm: a standard deviation is missing or not > 0");
        }
    }
    if (!(in >> tok) || tok != "end") {
        return bad("'end' missing");
    }
    return m;
}

tl::result<mlp> mlp::load(const std::string& path) {
    std::ifstream f(path);
    if (!f) {
        const int err = errno;
        return tl::make_error(tl::reason::not_found,
                              "mlp: open " + path + ": " + std::strerror(err));
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    auto m = parse(ss.str());
    if (!m) {
        return tl::make_error(m.err().reason, path + ": " + m.err().message);
    }
    return m;
}

tl::status mlp::save(const std::string& path) const {
    std::ofstream f(path, std::ios::trunc);
    f << serialize();
    f.close();
    if (!f) {
        const int err = errno;
        return tl::make_error(tl::reason::invalid_argument,
                              "mlp: write " + path + ": " + std::strerror(err));
    }
    return {};
}

}  // namespace qrt::fleet
