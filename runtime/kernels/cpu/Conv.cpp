// Causal depthwise conv1d with a halo: the rows that precede this segment on another rank.
#include <vector>

#include "runtime/kernels/cpu/Kernels.h"

namespace hcp::cpu {
namespace {

// Input row p of batch b, channel c, where p < 0 reaches back into the halo (or zero).
template <typename T>
T conv_input(const T* x, const T* halo, int64_t b, int64_t p, int64_t c, int64_t seq,
             int64_t channels, int64_t width) {
  if (p >= 0) return x[(b * seq + p) * channels + c];
  if (halo == nullptr) return T(0);
  return halo[(b * (width - 1) + (width - 1) + p) * channels + c];
}

// Whether output t of row b reads tap j: always, or with packed documents only within t's
// document (the tap's lag, width-1-j, at most t's position in it).
bool reads_tap(const int32_t* positions, int64_t b, int64_t t, int64_t j, int64_t seq,
               int64_t width) {
  return positions == nullptr || (width - 1) - j <= positions[b * seq + t];
}

// Gradient reaching input row p (p < 0: a halo row): the outputs t = p + (width-1) - j it feeds.
template <typename T>
double conv_input_grad(const T* dy, const T* w, const int32_t* positions, int64_t b, int64_t p,
                       int64_t c, int64_t seq, int64_t channels, int64_t width) {
  double acc = 0.0;
  for (int64_t j = 0; j < width; j++) {
    int64_t t = p + (width - 1) - j;
    if (t < 0 || t >= seq || !reads_tap(positions, b, t, j, seq, width)) continue;
    acc += static_cast<double>(dy[(b * seq + t) * channels + c]) *
           static_cast<double>(w[c * width + j]);
  }
  return acc;
}

}  // namespace

template <typename T>
void causal_conv1d_forward(T* y, const T* x, const T* halo, const T* w, const T* bias,
                           int64_t batch, int64_t seq, int64_t channels, int64_t width,
                           const int32_t* positions) {
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t t = 0; t < seq; t++) {
      for (int64_t c = 0; c < channels; c++) {
        double acc = static_cast<double>(bias[c]);
        for (int64_t j = 0; j < width; j++) {
          if (!reads_tap(positions, b, t, j, seq, width)) continue;
          T in = conv_input(x, halo, b, t - (width - 1) + j, c, seq, channels, width);
          acc += static_cast<double>(w[c * width + j]) * static_cast<double>(in);
        }
        y[(b * seq + t) * channels + c] = static_cast<T>(acc);
      }
    }
  }
}

template <typename T>
void causal_conv1d_backward(T* dx, T* dhalo, T* dw, T* dbias, const T* dy, const T* x,
                            const T* halo, const T* w, int64_t batch, int64_t seq, int64_t channels,
                            int64_t width, const int32_t* positions) {
  // Input gradients are gathered per input row, so every output element is written once.
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t p = 0; p < seq; p++) {
      for (int64_t c = 0; c < channels; c++) {
        dx[(b * seq + p) * channels + c] =
            static_cast<T>(conv_input_grad(dy, w, positions, b, p, c, seq, channels, width));
      }
    }
    if (dhalo != nullptr) {
      for (int64_t h = 0; h < width - 1; h++) {
        for (int64_t c = 0; c < channels; c++) {
          dhalo[(b * (width - 1) + h) * channels + c] = static_cast<T>(
              conv_input_grad(dy, w, positions, b, h - (width - 1), c, seq, channels, width));
        }
      }
    }
  }
  for (int64_t c = 0; c < channels; c++) {
    double db = 0.0;
    std::vector<double> dwc(width, 0.0);
    for (int64_t b = 0; b < batch; b++) {
      for (int64_t t = 0; t < seq; t++) {
        double g = static_cast<double>(dy[(b * seq + t) * channels + c]);
        db += g;
        for (int64_t j = 0; j < width; j++) {
          if (!reads_tap(positions, b, t, j, seq, width)) continue;
          T in = conv_input(x, halo, b, t - (width - 1) + j, c, seq, channels, width);
          dwc[j] += g * static_cast<double>(in);
        }
      }
    }
    dbias[c] = static_cast<T>(db);
    for (int64_t j = 0; j < width; j++) dw[c * width + j] = static_cast<T>(dwc[j]);
  }
}

#define HCP_INSTANTIATE(T)                                                                        \
  template void causal_conv1d_forward<T>(T*, const T*, const T*, const T*, const T*, int64_t,     \
                                         int64_t, int64_t, int64_t, const int32_t*);              \
  template void causal_conv1d_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*, const T*, \
                                          int64_t, int64_t, int64_t, int64_t, const int32_t*);
HCP_INSTANTIATE(float)
HCP_INSTANTIATE(double)
#undef HCP_INSTANTIATE

}  // namespace hcp::cpu
