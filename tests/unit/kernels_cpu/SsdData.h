// The inputs of one SSD scan as double vectors (the finite differences perturb them), shared by
// the SSD scan and packed-documents tests.
#pragma once

#include <cmath>
#include <random>

#include "runtime/kernels/cpu/Kernels.h"
#include "tests/unit/kernels_cpu/TestUtil.h"

namespace hcp::cpu::testing {

struct SsdData {
  SsdShape shape;
  Vec x, dt, A, B, C, D, init;

  SsdData(const SsdShape& s, std::mt19937& rng) : shape(s) {
    x = random_vec(rng, s.batch * s.seq * s.heads * s.head_dim);
    dt = random_vec(rng, s.batch * s.seq * s.heads, 0.05, 0.8);
    A = random_vec(rng, s.heads, -1.5, -0.2);
    B = random_vec(rng, s.batch * s.seq * s.groups * s.state);
    C = random_vec(rng, B.size());
    D = random_vec(rng, s.heads);
    init = random_vec(rng, state_size());
  }
  int64_t state_size() const { return shape.batch * shape.heads * shape.head_dim * shape.state; }

  // Runs the kernel; with_init = false passes a null initial state.
  void forward(Vec& y, Vec& final_state, bool with_init) const {
    y.assign(x.size(), NAN);
    final_state.assign(state_size(), NAN);
    ssd_scan_forward<double>(y.data(), final_state.data(), x.data(), dt.data(), A.data(), B.data(),
                             C.data(), D.data(), with_init ? init.data() : nullptr, shape);
  }
};

}  // namespace hcp::cpu::testing
