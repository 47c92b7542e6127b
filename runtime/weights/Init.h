// Deterministic random initialisation that does not depend on how a tensor is later sharded:
// element i of tensor "x" gets the same value whichever rank fills whichever range of it.
//
// The generator is counter-based: nothing is carried from one element to the next.
//   key        = Mix64(Mix64(seed) ^ Fnv1a64(name))      one stream per (seed, tensor name)
//   Draw(k, c) = Mix64(k + (c + 1) * 0x9E3779B97F4A7C15)  splitmix64's c-th output for seed k
//   uniforms   u = (Draw >> 11) * 2^-53, from draw counters 2p and 2p + 1 for pair p = i / 2
//   normals    Box-Muller on the pair: element 2p takes r cos(theta), element 2p + 1 r sin(theta)
// Changing any of these changes every initialised model; treat them as a file format.
#pragma once

#include <cstdint>
#include <string_view>

namespace hcp {

// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
uint64_t Fnv1a64(std::string_view bytes);
// splitmix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
uint64_t Mix64(uint64_t x);
// The stream key of tensor `name` under `seed`.
uint64_t InitStreamKey(uint64_t seed, std::string_view name);

// out[j] = stddev * N(0, 1) draw number (begin + j) of tensor `name`, for j in [0, count).
void FillNormal(float* out, int64_t begin, int64_t count, uint64_t seed, std::string_view name,
                float stddev);
// out[j] = uniform draw number (begin + j) of tensor `name` in [low, high).
void FillUniform(float* out, int64_t begin, int64_t count, uint64_t seed, std::string_view name,
                 float low, float high);
// out[j] = value for j in [0, count).
void FillConstant(float* out, int64_t count, float value);

}  // namespace hcp
