#include "tools/hybridcp/StepResult.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/support/Status.h"
#include "runtime/weights/Safetensors.h"

namespace hcp {
namespace {

constexpr char kGradPrefix[] = "grad.";

double RelativeRms(const std::vector<float>& value, const std::vector<float>& reference) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    diff += (double(value[i]) - reference[i]) * (double(value[i]) - reference[i]);
    norm += double(reference[i]) * reference[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Both results must hold gradients of the same parameters: a gradient compared with nothing, or
// a reference gradient the step did not produce, is a mismatch (a step without gradients must
// not "match" every reference).
absl::Status CheckSameGradientNames(const StepResult& actual, const StepResult& reference,
                                    const std::string& reference_name) {
  std::set<std::string> have, want;
  for (const auto& gradient : actual.gradients) have.insert(gradient.first);
  for (const auto& gradient : reference.gradients) want.insert(gradient.first);
  std::vector<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), have.begin(), have.end(),
                      std::back_inserter(missing));
  std::set_difference(have.begin(), have.end(), want.begin(), want.end(),
                      std::back_inserter(extra));
  if (missing.empty() && extra.empty() && have.size() == actual.gradients.size() &&
      want.size() == reference.gradients.size()) {
    return absl::OkStatus();
  }
  constexpr size_t kShown = 4;
  const auto listed = [&](const std::vector<std::string>& names) {
    std::string text = absl::StrJoin(
        names.begin(), names.begin() + std::min(names.size(), kShown), ", ",
        [](std::string* out, const std::string& name) { absl::StrAppend(out, "'", name, "'"); });
    if (names.size() > kShown) absl::StrAppend(&text, " and ", names.size() - kShown, " more");
    return text;
  };
  std::string problems;
  if (!missing.empty()) {
    absl::StrAppend(&problems, missing.size(), " reference gradients the step lacks (",
                    listed(missing), ")");
  }
  if (!extra.empty()) {
    absl::StrAppend(&problems, problems.empty() ? "" : "; ", extra.size(),
                    " gradients the reference lacks (", listed(extra), ")");
  }
  if (problems.empty()) problems = "a gradient name appears twice";
  return absl::FailedPreconditionError(absl::StrFormat(
      "the step does not match %s: the step has %d gradients, the reference %d: %s", reference_name,
      actual.gradients.size(), reference.gradients.size(), problems));
}

}  // namespace

StepResult StepResultOf(CpuExecutor& executor) {
  StepResult result;
  result.loss = executor.Loss();
  result.router_aux_loss = executor.RouterAuxLoss();
  for (const plan::Parameter& parameter : executor.parameters()) {
    std::span<float> gradient = *executor.Gradient(parameter.name);  // the plan's own names
    result.gradients.emplace_back(parameter.name,
                                  std::vector<float>(gradient.begin(), gradient.end()));
  }
  return result;
}

absl::StatusOr<StepResult> ReadStepResult(const std::string& path) {
  std::string file = std::filesystem::is_directory(path) ? path + "/reference.safetensors" : path;
  HCP_ASSIGN_OR_RETURN(SafetensorsFile tensors, SafetensorsFile::Open(file));
  StepResult result;
  HCP_ASSIGN_OR_RETURN(std::vector<float> loss, tensors.ReadF32("loss"));
  if (loss.size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: 'loss' must hold one value", file));
  }
  result.loss = loss[0];
  if (tensors.Find("router_aux_loss") != nullptr) {
    HCP_ASSIGN_OR_RETURN(std::vector<float> aux, tensors.ReadF32("router_aux_loss"));
    if (aux.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: 'router_aux_loss' must hold one value", file));
    }
    result.router_aux_loss = aux[0];
  }
  for (const std::string& name : tensors.names()) {
    if (name.rfind(kGradPrefix, 0) != 0) continue;
    HCP_ASSIGN_OR_RETURN(std::vector<float> values, tensors.ReadF32(name));
    result.gradients.emplace_back(name.substr(sizeof(kGradPrefix) - 1), std::move(values));
  }
  return result;
}

absl::Status WriteStepResult(const StepResult& result, const std::string& path) {
  std::vector<TensorToWrite> tensors = {
      {"loss", DType::F32, {1}, std::span<const float>(&result.loss, 1), {}}};
  if (result.router_aux_loss) {
    tensors.push_back({"router_aux_loss",
                       DType::F32,
                       {1},
                       std::span<const float>(&*result.router_aux_loss, 1),
                       {}});
  }
  for (const auto& [name, values] : result.gradients) {
    tensors.push_back(
        {kGradPrefix + name, DType::F32, {static_cast<int64_t>(values.size())}, values, {}});
  }
  return WriteSafetensors(path, tensors);
}

absl::Status CompareStepResults(const StepResult& actual, const StepResult& reference,
                                const std::string& reference_name, const Tolerances& tolerances,
                                bool verbose) {
  double loss_error =
      std::abs(double(actual.loss) - reference.loss) / std::abs(double(reference.loss));
  std::printf("reference loss %.7f, relative error %.3e (tolerance %.0e)\n", reference.loss,
              loss_error, tolerances.loss);
  // The load-balancing loss is held to the loss's tolerance; both sides have it, or neither.
  if (actual.router_aux_loss.has_value() != reference.router_aux_loss.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the step does not match %s: %s has the MoE load-balancing loss, %s not",
                        reference_name, actual.router_aux_loss ? "the step" : "the reference",
                        actual.router_aux_loss ? "the reference" : "the step"));
  }
  if (reference.router_aux_loss) {
    const double aux_error =
        std::abs(double(*actual.router_aux_loss) - *reference.router_aux_loss) /
        std::abs(double(*reference.router_aux_loss));
    std::printf("reference load-balancing loss %.7f, relative error %.3e (tolerance %.0e)\n",
                *reference.router_aux_loss, aux_error, tolerances.loss);
    loss_error = std::max(loss_error, aux_error);
  }
  std::map<std::string, const std::vector<float>*> expected;
  for (const auto& [name, values] : reference.gradients) expected[name] = &values;
  HCP_RETURN_IF_ERROR(CheckSameGradientNames(actual, reference, reference_name));
  double worst = 0;
  std::string worst_name;
  int failures = 0;
  for (const auto& [name, values] : actual.gradients) {
    auto it = expected.find(name);
    if (it->second->size() != values.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: the gradient of '%s' has %d values, the step's has %d",
                          reference_name, name, it->second->size(), values.size()));
    }
    double error = RelativeRms(values, *it->second);
    bool ok = error <= tolerances.grad;
    failures += !ok;
    if (verbose || !ok) {
      std::printf("  %-60s relative RMS %.3e%s\n", name.c_str(), error, ok ? "" : "  FAIL");
    }
    if (!(error <= worst)) {
      worst = error;
      worst_name = name;
    }
  }
  std::printf("gradients: %zu compared, worst relative RMS %.3e (%s), tolerance %.0e\n",
              actual.gradients.size(), worst, worst_name.c_str(), tolerances.grad);
  if (!(loss_error <= tolerances.loss) || failures > 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the step does not match %s: loss error %.3e, %d gradients over tolerance",
                        reference_name, loss_error, failures));
  }
  std::printf("MATCH\n");
  return absl::OkStatus();
}

}  // namespace hcp
