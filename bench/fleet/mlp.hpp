#pragma once
// A small multi-layer perceptron for inference in plain C++: no LibTorch,
// no allocation per call once the scratch buffers are sized, so the same
// code can run inside qrt-fleet-sim and, later, inside qrtd.
//
// File format (text, one token stream, '#' starts a comment line):
//
//   qrt-mlp 1
//   inputs <n>
//   layers <L>
//   layer <in> <out> <activation>      # activation: relu | tanh | linear
//   <out rows of in weights> <out biases>
//   ... L layers ...
//   norm <n means> <n standard deviations>   # input standardisation
//   end
//
// Written by qrt-fleet-train (LibTorch) and read here; every number is
// printed with %.9g so a save/load round trip is exact for float weights.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "qrt/timeline/types.hpp"

namespace qrt::fleet {

enum class activation : unsigned char { relu, tanh, linear };

struct dense_layer {
    std::size_t in = 0;
    std::size_t out = 0;
    activation act = activation::linear;
    std::vector<float> w;  // out x in, row-major
    std::vector<float> b;  // out
};

class mlp {
public:
    mlp() = default;
    // Layer sizes, e.g. {12, 32, 32, 1}; hidden layers use act, the last is linear.
    // Weights start at zero; fill them with set_params or load.
    mlp(const std::vector<std::size_t>& sizes, activation act);

    static timeline::result<mlp> parse(std::string_view text);
    static timeline::result<mlp> load(const std::string& path);
    std::string serialize() const;
    timeline::status save(const std::string& path) const;

    std::size_t inputs() const noexcept { return _layers.empty() ? 0 : _layers.front().in; }
    std::size_t outputs() const noexcept { return _layers.empty() ? 0 : _layers.back().out; }
    bool empty() const noexcept { return _layers.empty(); }
    std::vector<dense_layer>& layers() noexcept { return _layers; }
    const std::vector<dense_layer>& layers() const noexcept { return _layers; }
    std::vector<float>& norm_mean() noexcept { return _mean; }
    std::vector<float>& norm_std() noexcept { return _std; }

    // The first output for one input vector (size inputs()).
    float eval1(const float* x) const noexcept;

private:
    std::vector<dense_layer> _layers;
    std::vector<float> _mean;
    std::vector<float> _std;
    mutable std::vector<float> _a;
    mutable std::vector<float> _b;
};

}  // namespace qrt::fleet
